"""The ``--interconnect`` flag's value as the brief's network fields (``estimate`` and ``plan``).

A fabric name, NICs x rate, or a rate per GPU or per node; read with the request reader's NIC
patterns (tools/intake/hardware_text.py).
"""

from __future__ import annotations

import re
from typing import Any

from tools.core.errors import InputError
from tools.intake.count_words import normalise
from tools.intake.hardware_text import HardwareReading, read_host
from tools.research.hardware import INTERCONNECTS

# "--interconnect 400Gbps per GPU", "200G/node", "100 Gb/s": one rate, per GPU or per node.
_RATE_RE = re.compile(
    r"^(\d{1,5}(?:\.\d+)?)\s*(?:g|gb|gbit|gbps|gb/s|gbe)\s*(?:nics?\s*)?"
    r"(?:(per\s+gpu|/\s*gpu|each\s+gpu)|(per\s+node|/\s*node))?$",
    re.I,
)


def network_fields(text: str, gpus_per_node: int) -> dict[str, Any]:
    """The brief's network fields from an ``--interconnect`` value, or InputError naming it.

    A fabric name (ib400, ib200, roce100, eth25, nvlink) sets ``interconnect``; a count and a
    rate ("8x400G", "8x400G IB", "4 x 200Gb RoCE", read as the request reader reads NICs) or a
    rate per GPU ("400Gbps per GPU": one NIC per GPU, as HGX/DGX nodes have) or per node
    ("200G per node") set ``nics_per_node`` and ``nic_gbps``.
    """
    value = text.strip()
    if value.lower() in INTERCONNECTS:
        return {"interconnect": value.lower()}
    reading = HardwareReading(text=value)
    read_host(normalise(value), reading)
    data: dict[str, Any] = {}
    if reading.nic_gbps is not None:
        data = {"nics_per_node": reading.nics_per_node or 1, "nic_gbps": reading.nic_gbps}
    elif m := _RATE_RE.match(value):
        nics = max(1, gpus_per_node) if m.group(2) else 1
        data = {"nics_per_node": nics, "nic_gbps": float(m.group(1))}
    if not data or not 0 < data["nic_gbps"] <= 10_000 or not 1 <= data["nics_per_node"] <= 64:
        raise InputError(
            "--interconnect",
            f"cannot read {value!r}: give one of {', '.join(INTERCONNECTS)}, NICS x RATE "
            "(8x400G) or a rate per GPU or per node (400Gbps per GPU)",
        )
    if reading.interconnect is not None:
        data["interconnect"] = reading.interconnect
    return data
