"""The artifacts stage's unit tests validate configs with DeepSpeed's and transformers' own code."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _validators_imported() -> None:
    """Import DeepSpeed (quietly, as the product does) and transformers' DeepSpeed integration once.

    Their first import takes seconds; paid here, in set-up, it is the tier's one-time cost
    rather than a share of whichever test happens to validate first (the unit tier's time
    limit applies to each test's call).
    """
    from tools.core.imports import import_deepspeed_quietly

    import_deepspeed_quietly()
    import deepspeed.runtime.config  # noqa: F401
    import transformers.integrations.deepspeed  # noqa: F401

    from tools.artifacts.ds_validate import validate_deepspeed_config

    # The first validation also loads what DeepSpeedConfig imports lazily (the accelerator).
    validate_deepspeed_config({"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1}, 1)
