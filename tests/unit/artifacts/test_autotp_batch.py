"""DeepSpeed AutoTP's batch arithmetic as DeepSpeed 0.19.8 runs it.

Under AutoTP (``tensor_parallel.autotp_size`` in ds_config.json, no ``mpu`` given to
``deepspeed.initialize``), DeepSpeedConfig checks ``train_batch_size`` against
micro x accumulation x the whole world (``dist.get_world_size()``, deepspeed/runtime/config.py),
not the data-parallel group: on 2 CPU gloo ranks with autotp_size 2 (bench/results/
2026-12-06-launch-parsers.md), train_batch_size 2 = micro 1 x accumulation 2 x dp 1 stopped in
deepspeed.initialize ('2 != 1 * 2 * 2') and 4 ran (the engine's dp_world_size 1).
"""

from __future__ import annotations

from specs import LLAMA3_8B

from tools.artifacts.deepspeed_config import emit_deepspeed_config
from tools.artifacts.ds_rules import check_deepspeed_rules
from tools.core.schemas import HardwareSpec, TrainingBrief
from tools.planning import SearchOptions, search_strategy
from tools.planning.batch_layout import BatchLayout, deepspeed_batch_ranks
from tools.research.hardware import parse_hardware

BRIEF = TrainingBrief(
    model="llama-3-8b",
    seq_len=4096,
    global_batch_size=64,
    precision="bf16",
    hardware="1x8xH100-80GB",
)


def _autotp_config(hw: HardwareSpec, tp: int) -> tuple[dict, int]:
    plan = search_strategy(
        LLAMA3_8B, hw, BRIEF, SearchOptions(tensor_parallel=tp, pipeline_parallel=1)
    )
    assert plan.tensor_parallel == tp
    return emit_deepspeed_config(plan, LLAMA3_8B, hw, BRIEF, autotp=True), hw.world_size


def test_autotp_train_batch_size_counts_the_whole_world() -> None:
    config, world = _autotp_config(parse_hardware("1x8xH100-80GB"), 2)
    assert config["tensor_parallel"] == {"autotp_size": 2}
    micro, accum = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    # The sequences per step stay the brief's: micro x accumulation x (world / tp).
    assert micro * accum * (world // 2) == BRIEF.global_batch_size
    # What DeepSpeedConfig checks: micro x accumulation x world.
    assert config["train_batch_size"] == micro * accum * world
    assert deepspeed_batch_ranks(config, world // 2) == world
    check_deepspeed_rules(config, deepspeed_batch_ranks(config, world // 2))
    # The layout read back from the config is the plan's: data parallel world / tp.
    assert BatchLayout.of_deepspeed(config).data_parallel == world // 2
    assert BatchLayout.of_deepspeed(config).global_batch == BRIEF.global_batch_size


def test_without_autotp_the_batch_ranks_are_the_data_parallel_group() -> None:
    config = {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
    }
    assert deepspeed_batch_ranks(config, 8) == 8
    assert BatchLayout.of_deepspeed(config).data_parallel == 8
