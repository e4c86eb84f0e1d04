"""The smoke stage's unit tests tokenize with transformers: imported once, in set-up."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _transformers_imported() -> None:
    """Import transformers' tokenizer classes once (seconds), not inside the first test's call."""
    import transformers

    transformers.PreTrainedTokenizerFast  # noqa: B018 - the lazy module loads here
