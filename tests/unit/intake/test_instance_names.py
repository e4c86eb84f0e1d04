"""Cloud instance types are hardware: "AWS p4d.24xlarge x 4" is 4 nodes of 8 A100 40GB.

Before, an instance type read as no hardware: the plan was sized for B200s instead, and "x 4"
was listed as not understood.
"""

from __future__ import annotations

import pytest

from tools.intake.hardware_text import HARDWARE_ASSUMED, hardware_fields
from tools.intake.instance_names import INSTANCES


@pytest.mark.parametrize(
    ("text", "spec", "nics", "gbps"),
    [
        ("pretrain a 1B llama on AWS p4d.24xlarge x 4, seq 2048", "4x8xA100-40GB", 4, 100.0),
        ("fine-tune llama-3-8b on 2x p5.48xlarge", "2x8xH100-80GB", 32, 100.0),
        ("fine-tune llama-3-8b on 3 p4de.24xlarge instances", "3x8xA100-80GB", 4, 100.0),
        ("fine-tune llama-3-8b on two a2-ultragpu-8g instances", "2x8xA100-80GB", None, None),
        ("LoRA on llama-3-8b with a g5.12xlarge", "1x4xA10G", None, None),
        ("fine-tune llama-3.1-70b on ND96isr_H100_v5 x 2", "2x8xH100-80GB", 8, 400.0),
    ],
)
def test_an_instance_type_is_its_nodes_gpus_and_network(
    text: str, spec: str, nics: int | None, gbps: float | None
) -> None:
    fields = hardware_fields(text)
    assert fields["hardware"] == spec
    assert fields.get("nics_per_node") == nics and fields.get("nic_gbps") == gbps
    name = next(n for n in INSTANCES if n in text.lower())
    assert any(name in line.lower() for line in fields[HARDWARE_ASSUMED]), fields


def test_every_instance_type_reads_as_its_gpu_count() -> None:
    for name, inst in INSTANCES.items():
        fields = hardware_fields(f"fine-tune llama-3-8b on one {name}")
        assert fields.get("hardware", "").startswith(f"1x{inst.gpus}x"), (name, fields)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        # Before, the plain "A10Gs" mention came first and left "1 node of A10G" unclear, so a
        # budget beside it made the request a sizing question and the instance type was ignored.
        ("We've got access to A10Gs on AWS (g5.48xlarge, 1 node).", "1x8xA10G"),
        ("our H100s: 2 nodes of 8 H100 80GB", "2x8xH100-80GB"),
    ],
)
def test_a_counted_mention_wins_over_a_plain_one_of_the_same_gpu(text: str, spec: str) -> None:
    assert hardware_fields(text)["hardware"] == spec
