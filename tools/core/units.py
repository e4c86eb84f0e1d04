"""Units, defined once: the decimal gigabyte and how a byte count is written in GB."""

from __future__ import annotations

# Vendors quote GPU memory in decimal GB ("80GB"); 80e9 bytes is ~7% under the 80 GiB an
# A100-80GB has, which leaves room for what the driver and ECC reserve.
GB = 1_000_000_000


def gb_text(
    n_bytes: float | None, digits: int = 1, *, unit: bool = True, missing: str = "-"
) -> str:
    """``n_bytes`` in decimal GB with ``digits`` decimals (``"12.3 GB"``); ``missing`` for None."""
    if n_bytes is None:
        return missing
    return f"{n_bytes / GB:.{digits}f}" + (" GB" if unit else "")
