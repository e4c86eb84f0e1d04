"""How a bare batch size was read: "bs=32", "bsz 64", "batch size 32" are the global batch.

Before, "bs=32" and "bsz 64" were listed as not understood. They are read as "batch size 32"
always was (tools/intake/numbers_text.py): the global batch, sequences per optimizer step over
every GPU. A Hugging Face user may mean ``per_device_train_batch_size``; the words do not say,
so "I assumed" says which reading was taken and how to ask for the other ("per GPU").
"""

from __future__ import annotations

import re

from tools.core.request_account import AssumedFact
from tools.intake.numbers_text import batch_reading

# A batch named without "global", "total", "effective", "per GPU" or a unit of steps.
_BARE_RE = re.compile(r"(?:batch(?:[ _-]?size)?|bsz?)\b", re.I)


def batch_assumed(text: str, seq_len: int, stated: bool) -> list[AssumedFact]:
    """The line saying a bare batch size was read as the global batch (``stated``: it was read)."""
    read, how = batch_reading(text, seq_len)
    if not stated or read is None or how is not None or not _BARE_RE.match(read.quote):
        return []
    return [
        AssumedFact(
            field="global_batch_size",
            value=read.value,
            why=(
                f"{read.quote!r} read as the global batch (sequences per optimizer step over "
                "all GPUs), as 'batch size N' always is; say 'per GPU' (e.g. 'batch 4 per GPU') "
                "for a micro-batch like Hugging Face's per_device_train_batch_size"
            ),
        )
    ]
