"""Cloud instance types in a request: "AWS p4d.24xlarge x 4" is 4 nodes of 8 A100 40GB.

A request that names its machines by the cloud's instance type ("4x p5.48xlarge", "two
a2-ultragpu-8g", "ND96isr_H100_v5 x 2") used to read as no hardware at all: the plan was sized
for some other GPU (B200) and "x 4" listed as not understood. Each type here is the GPUs per
instance as the provider's instance-type page lists them, and, where that page states it, the
instance's network (AWS EFA: p4d 4 x 100 Gb/s, p5 32 x 100 Gb/s, p5en 16 x 200 Gb/s; Azure
ND v4/v5 8 x 200/400 Gb/s InfiniBand). ``rewrite`` turns the words into the hardware phrase the
hardware reader already reads ("4 nodes of 8 A100 40GB SXM, 4x100G EFA"); ``INSTANCE_RE`` is
where the words stood, for the request's quotes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Instance:
    """One instance type: its GPUs as the hardware reader reads them, and its network."""

    gpus: int
    gpu: str  # words the hardware reader resolves to one catalog part
    network: str = ""  # "4x100G EFA": NICs x rate, as the reader reads NICs; "" when not stated
    source: str = ""  # where the figures are listed


_AWS = "AWS EC2 accelerated-computing instance types"
_GCP = "Google Cloud GPU machine types"
_AZURE = "Azure ND-series sizes"
INSTANCES: dict[str, Instance] = {
    "p3.16xlarge": Instance(8, "V100 16GB SXM", source=_AWS),
    "p3dn.24xlarge": Instance(8, "V100 32GB SXM", "1x100G EFA", _AWS),
    "p4d.24xlarge": Instance(8, "A100 40GB SXM", "4x100G EFA", _AWS),
    "p4de.24xlarge": Instance(8, "A100 80GB SXM", "4x100G EFA", _AWS),
    "p5.48xlarge": Instance(8, "H100 80GB SXM", "32x100G EFA", _AWS),
    "p5e.48xlarge": Instance(8, "H200", "32x100G EFA", _AWS),
    "p5en.48xlarge": Instance(8, "H200", "16x200G EFA", _AWS),
    "p6-b200.48xlarge": Instance(8, "B200", "8x400G EFA", _AWS),
    "g5.xlarge": Instance(1, "A10G", source=_AWS),
    "g5.12xlarge": Instance(4, "A10G", source=_AWS),
    "g5.48xlarge": Instance(8, "A10G", source=_AWS),
    "g6.xlarge": Instance(1, "L4", source=_AWS),
    "g6.48xlarge": Instance(8, "L4", source=_AWS),
    "g6e.xlarge": Instance(1, "L40S", source=_AWS),
    "g6e.12xlarge": Instance(4, "L40S", source=_AWS),
    "g6e.48xlarge": Instance(8, "L40S", source=_AWS),
    "a2-highgpu-1g": Instance(1, "A100 40GB SXM", source=_GCP),
    "a2-highgpu-8g": Instance(8, "A100 40GB SXM", source=_GCP),
    "a2-ultragpu-8g": Instance(8, "A100 80GB SXM", source=_GCP),
    "a3-highgpu-8g": Instance(8, "H100 80GB SXM", source=_GCP),
    "a3-megagpu-8g": Instance(8, "H100 80GB SXM", source=_GCP),
    "a3-ultragpu-8g": Instance(8, "H200", source=_GCP),
    "nd96asr_v4": Instance(8, "A100 40GB SXM", "8x200G IB", _AZURE),
    "nd96amsr_a100_v4": Instance(8, "A100 80GB SXM", "8x200G IB", _AZURE),
    "nd96isr_h100_v5": Instance(8, "H100 80GB SXM", "8x400G IB", _AZURE),
    "nd96isr_mi300x_v5": Instance(8, "MI300X", "8x400G IB", _AZURE),
}
_COUNT_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "six": 6, "eight": 8, "sixteen": 16}
_NAMES = "|".join(re.escape(n) for n in sorted(INSTANCES, key=len, reverse=True))
# [count [x]] [aws|gcp|azure] NAME [instances] [x count]: "4x p4d.24xlarge", "AWS p4d.24xlarge x 4".
INSTANCE_RE = re.compile(
    r"(?:(?<![\w.])(?P<count>\d{1,4}|" + "|".join(_COUNT_WORDS) + r")\s*(?:[x×]\s*)?)?"
    r"(?:(?:aws|ec2|gcp|google\s+cloud|azure)\s+)?"
    r"(?<![\w.-])(?P<name>" + _NAMES + r")(?![\w.-])"
    r"(?:\s+(?:instances?|nodes?|machines?|vms?))?"
    r"(?:\s*[x×]\s*(?P<post>\d{1,4})(?![\d.]))?",
    re.I,
)


def rewrite(text: str) -> tuple[str, list[tuple[str, str]]]:
    """The text with each instance type as a hardware phrase; per type, what it is and the words."""
    said: list[tuple[str, str]] = []

    def phrase(m: re.Match[str]) -> str:
        inst = INSTANCES[m["name"].lower()]
        count = m["count"] or m["post"] or "1"
        nodes = int(count) if count.isdigit() else _COUNT_WORDS[count.lower()]
        net = f", {inst.network}" if inst.network else ""
        line = (
            f"{m['name']} is {inst.gpus} x {inst.gpu} per instance"
            f"{' with ' + inst.network if inst.network else ''} ({inst.source})"
        )
        said.append((line, m.group(0).strip()))
        return f" {nodes} nodes of {inst.gpus} {inst.gpu}{net} "

    return INSTANCE_RE.sub(phrase, text), said
