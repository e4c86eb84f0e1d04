"""The research stage's unit tests count models with transformers on the meta device."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _transformers_imported() -> None:
    """Import torch and transformers once, in set-up: their first import takes seconds.

    A model given only by its size or shape is counted live on the meta device; the first test
    to do so would otherwise pay the import inside the unit tier's per-test time limit.
    """
    import torch  # noqa: F401
    import transformers  # noqa: F401
