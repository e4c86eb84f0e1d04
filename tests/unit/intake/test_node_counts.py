"""Node counts written with a hyphen ("a 2-node cluster") are nodes.

Before, "fine-tune llama-3-8b on a 2-node cluster, 8xH100 per node" planned one node of 8
H100 and listed "a 2-node cluster" as not understood.
"""

from __future__ import annotations

import pytest

from tools.intake.account import account_request
from tools.intake.brief import brief_from_dict, request_fields
from tools.intake.hardware_text import hardware_fields


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("fine-tune llama-3-8b on a 2-node cluster, 8xH100 per node", "2x8xH100-80GB"),
        ("pretrain llama-3-8b on a 4-node H100 cluster with 8 GPUs per node", "4x8xH100-80GB"),
        ("fine-tune llama-3-8b on 16 A100 over a 2-node setup", "2x8xA100-80GB"),
    ],
)
def test_a_hyphenated_node_count_is_the_node_count(text: str, spec: str) -> None:
    assert hardware_fields(text)["hardware"] == spec
    fields = request_fields(text, ["llama-3-8b"])
    brief = brief_from_dict({k: v for k, v in fields.items() if not k.startswith("_")})
    account = account_request(text, fields, brief)
    assert not [q for q in account.not_understood if "node" in q]


def test_a_follow_up_with_a_hyphenated_node_count_keeps_the_gpus_per_node() -> None:
    from tools.intake.follow_up import follow_up_fields

    brief = {"model": "llama-3-8b", "hardware": "1x8xA100-80GB", "task": "finetune"}
    assert follow_up_fields("make it a 4-node run", brief, ["llama-3-8b"]) == {
        "hardware": "4x8xA100-80GB"
    }


def test_a_total_that_contradicts_a_stated_count_per_node_is_unclear() -> None:
    # Before, "8 A100 with 8 GPUs per node and 2 nodes" planned 2 nodes of 4, silently.
    from tools.intake.hardware_text import HARDWARE_UNCLEAR

    fields = hardware_fields("fine-tune llama-3-8b on 8 A100 with 8 GPUs per node and 2 nodes")
    assert "hardware" not in fields
    assert "'8 GPUs per node'" in fields[HARDWARE_UNCLEAR]
    # Agreeing words stay read: 16 over 2 nodes is 8 per node.
    agreed = hardware_fields("fine-tune llama-3-8b on 16 A100, 8 GPUs per node, 2 nodes")
    assert agreed["hardware"] == "2x8xA100-80GB"


def test_chinese_counts_are_read_by_one_rule() -> None:
    # Node and GPU counts took a table of 1-10, 12, 16, 32 and 64 (三卡 read, 二十四张卡 not);
    # deadlines had their own copy of the digits. One reader now serves both.
    from tools.intake.count_words import chinese_number, normalise
    from tools.intake.sizing_text import deadline_seconds

    assert [chinese_number(t) for t in ("三", "十", "十五", "二十四", "九十九")] == [
        3,
        10,
        15,
        24,
        99,
    ]
    assert chinese_number("百") is None and chinese_number("十十") is None
    assert "24 gpus" in normalise("二十四张卡") or " 24 " in normalise("二十四张卡")
    assert deadline_seconds("二十天内") == 20 * 86_400.0
