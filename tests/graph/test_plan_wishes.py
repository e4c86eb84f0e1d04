"""The wishes a finished plan decides are marked from the plan made, never left "not checked".

A request on given hardware with a deadline, a budget and named techniques: the deadline and the
budget against the plan's own size in the scaling table, activation checkpointing honoured
(the recipe's recompute, kept by the search), 8-bit Adam and torch.compile refused with the
launch's reason. Before, all five stayed "not checked" although the plan's numbers decided them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REQUEST = (
    "continued pretraining of llama-3.1-70b on 64 H100 for 50B tokens, budget $20k, finish "
    "within 2 weeks, with gradient checkpointing, 8-bit Adam and torch.compile"
)


def _plan(cli_main: Any, tmp_path: Path, text: str) -> tuple[dict[str, Any], str]:
    out = tmp_path / "plan"
    res = cli_main("plan", text, "--no-smoke", "--out", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return json.loads((out / "plan.json").read_text()), res.stdout


def test_deadline_budget_and_techniques_are_decided_by_the_plan(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, stdout = _plan(cli_main, tmp_path, REQUEST)
    wishes = {w["wish"]: w for w in plan["request"]["wishes"]}
    row = next(r for r in plan["scaling"]["rows"] if r["chosen"])
    days = row["hours"] / 24
    assert wishes["deadline"]["honoured"] is (days <= 14)
    assert f"{days:.1f} days" in wishes["deadline"]["how"]
    assert wishes["money-budget"]["honoured"] is (row["cost"] <= 20_000) is False
    assert f"{row['cost']:,.0f} USD" in wishes["money-budget"]["how"]
    assert plan["memory"]["activation_checkpointing"] is True
    assert wishes["technique:activation-checkpointing"]["honoured"] is True
    assert plan["brief"]["recipe"]["checkpointing"] == "full"
    for name in ("technique:8bit-optimizer", "technique:torch.compile"):
        assert wishes[name]["honoured"] is False
    refused = [line for line in stdout.splitlines() if line.startswith("not as asked:")]
    assert any("budget not met" in line.lower() for line in refused)
    assert any("8-bit Adam not planned" in line for line in refused)
    assert not [w for w in wishes.values() if w["honoured"] is None]


def test_a_refused_checkpointing_is_no_recompute(cli_main: Any, tmp_path: Path) -> None:
    plan, _ = _plan(
        cli_main, tmp_path, "fine-tune llama-3.1-8b on 8 A100 80GB without gradient checkpointing"
    )
    assert plan["brief"]["recipe"]["checkpointing"] == "none"
    assert plan["memory"]["activation_checkpointing"] is False
    # The wish is decided, not "not checked" beside a plan that honours it.
    (wish,) = [
        w for w in plan["request"]["wishes"] if w["wish"] == "avoid:activation-checkpointing"
    ]
    assert wish["honoured"] is True and "recomputes nothing" in wish["how"]


def test_a_micro_batch_is_pinned_and_accumulation_judged(cli_main: Any, tmp_path: Path) -> None:
    plan, _ = _plan(
        cli_main,
        tmp_path,
        "fine-tune llama-3.1-8b on 8 H100 with micro batch 4 and gradient accumulation 8",
    )
    assert plan["brief"]["global_batch_size"] == 256
    assert plan["memory"]["micro_batch_size"] == 4
    assert "pinned by the request: micro-batch 4" in plan["memory"]["assumptions"]
    wishes = {w["wish"]: w for w in plan["request"]["wishes"]}
    assert wishes["micro-batch"]["honoured"] is True
    steps = plan["memory"]["gradient_accumulation_steps"]
    assert wishes["grad-accum"]["honoured"] is (steps == 8)
    assert str(steps) in wishes["grad-accum"]["how"]


def test_hybrid_sharding_is_decided_not_dropped(cli_main: Any, tmp_path: Path) -> None:
    """Across nodes the plan shards over every GPU and says so; on one node FULL_SHARD is it."""
    plan, stdout = _plan(
        cli_main, tmp_path, "pretrain llama-3-8b on 4 nodes of 8 H100 with FSDP hybrid sharding"
    )
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == "technique:hybrid-sharding")
    assert wish["honoured"] is False and wish["quote"] == "hybrid sharding"
    assert any(
        line.startswith("not as asked:") and "--fsdp-sharding hybrid" in line
        for line in stdout.splitlines()
    ), stdout
    (tmp_path / "one").mkdir()
    one_node, _ = _plan(
        cli_main, tmp_path / "one", "fine-tune llama-2-13b on 8 A100-40GB with FSDP hybrid sharding"
    )
    wish = next(
        w for w in one_node["request"]["wishes"] if w["wish"] == "technique:hybrid-sharding"
    )
    assert (wish["honoured"], one_node["memory"]["chosen"]) == (True, "zero3"), wish


def test_tensor_parallelism_across_nodes_is_decided_not_dropped(
    cli_main: Any, tmp_path: Path
) -> None:
    # The placement was read as nothing: no wish, nothing listed, the plan's TP inside a node.
    plan, stdout = _plan(
        cli_main,
        tmp_path,
        "fine-tune llama-3.1-70b on 4 nodes of 8 H100 with tensor parallelism across nodes",
    )
    (wish,) = [w for w in plan["request"]["wishes"] if w["wish"] == "technique:tp-across-nodes"]
    assert wish["quote"] == "tensor parallelism across nodes"
    tp = plan["memory"]["tensor_parallel"]
    assert wish["honoured"] is (tp > 8)
    if tp <= 8:
        assert f"tensor parallel {tp} stays within each node's 8 GPUs" in wish["how"]
        assert any("Tensor parallelism not across nodes" in line for line in stdout.splitlines())


def test_packing_is_said_and_nvme_offload_refused(cli_main: Any, tmp_path: Path) -> None:
    """ "with packing" and "offload to NVMe" were dropped without a word (the plan offloads to CPU)."""
    plan, stdout = _plan(
        cli_main,
        tmp_path,
        "fine-tune qwen2.5-32b on 8 H20 with sample packing and ZeRO-3 offload to NVMe",
    )
    wishes = {w["wish"]: w for w in plan["request"]["wishes"]}
    assert wishes["technique:packing"]["honoured"] is True
    assert "packs them into seq_len blocks" in wishes["technique:packing"]["how"]
    nvme = wishes["technique:nvme-offload"]
    assert nvme["honoured"] is False and plan["memory"]["chosen"] in nvme["how"]
    assert plan["deepspeed_config"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert any(
        line.startswith("not as asked: NVMe offload not planned") for line in stdout.splitlines()
    )


def test_flash_attention_is_decided_from_the_launchs_kernel(cli_main: Any, tmp_path: Path) -> None:
    """ "with flash attention" stayed "not checked"; the plan knows which kernel its launch runs."""
    plan, _ = _plan(cli_main, tmp_path, "fine-tune mistral-7b on 4 A100 80GB with FlashAttention-2")
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == "technique:flash-attention")
    assert wish["honoured"] is True and "scaled_dot_product_attention" in wish["how"]
    (tmp_path / "v100").mkdir()
    plan, stdout = _plan(
        cli_main, tmp_path / "v100", "fine-tune llama-3-8b on 8 V100 32GB with flash attention"
    )
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == "technique:flash-attention")
    assert wish["honoured"] is False and "Ampere or newer" in wish["how"]
    assert any(
        line.startswith("not as asked: FlashAttention not planned") for line in stdout.splitlines()
    )


def test_resuming_another_runs_checkpoint_is_refused_with_what_to_do(
    cli_main: Any, tmp_path: Path
) -> None:
    plan, stdout = _plan(
        cli_main,
        tmp_path,
        "fine-tune llama-3.1-8b on 8 A100 40GB, resume from checkpoint /ckpt/step-4000",
    )
    wish = next(w for w in plan["request"]["wishes"] if w["wish"] == "checkpoint:resume")
    assert wish["quote"] == "resume from checkpoint /ckpt/step-4000"
    assert wish["honoured"] is False and "MODEL_PATH" in wish["how"]
    assert plan["request"]["not_understood"] == []
    assert any(
        line.startswith("not as asked: Resuming another run") for line in stdout.splitlines()
    )


def test_a_second_framework_named_is_said_not_used(cli_main: Any, tmp_path: Path) -> None:
    # "with fsdp, with megatron": the first named is the brief's framework; the second was
    # dropped without a word (no wish, nothing under "Not as asked").
    plan, stdout = _plan(
        cli_main, tmp_path, "pretrain gpt2 on 8 A100 40GB, with fsdp, with megatron"
    )
    wishes = {w["wish"]: w for w in plan["request"]["wishes"]}
    assert plan["framework"]["primary"] == "pytorch_fsdp"
    assert wishes["framework:pytorch_fsdp"]["honoured"] is True
    megatron = wishes["framework:megatron"]
    assert megatron["honoured"] is False and "the first (pytorch_fsdp)" in megatron["how"]
    assert "not as asked: Megatron not used: the plan runs on pytorch_fsdp" in stdout
    # Megatron-DeepSpeed runs DeepSpeed: "megatron with deepspeed" keeps both.
    (tmp_path / "b").mkdir()
    both, _ = _plan(
        cli_main, tmp_path / "b", "pretrain gpt-3-6.7b on 16 H100 with megatron and deepspeed"
    )
    marks = {w["wish"]: w["honoured"] for w in both["request"]["wishes"]}
    assert marks.get("framework:megatron") is True and marks.get("framework:deepspeed") is True


def test_context_extension_says_the_rope_is_unchanged(cli_main: Any, tmp_path: Path) -> None:
    """ "extend llama-3-8b to 64k context" planned 64k sequences on the model's own RoPE, silently."""
    plan, stdout = _plan(
        cli_main, tmp_path, "extend llama-3-8b to 32k context on 8 H100, 500M tokens"
    )
    assert plan["brief"]["seq_len"] == 32768
    (wish,) = [w for w in plan["request"]["wishes"] if w["wish"] == "technique:context-extension"]
    assert wish["quote"] == "extend llama-3-8b to 32k context" and wish["honoured"] is False
    assert "32768" in wish["how"] and "rope_theta" in wish["how"]
    assert any(line.startswith("not as asked: ") and "RoPE" in line for line in stdout.splitlines())


def test_a_budget_on_an_unpriced_gpu_says_the_price_is_missing(
    cli_main: Any, tmp_path: Path
) -> None:
    """A10G has no cited price: the budget said "the request gives no token count", which it did."""
    plan, _ = _plan(cli_main, tmp_path, "SFT mistral-7b on 8 A10G, 36M tokens, budget $500")
    assert plan["brief"]["dataset_tokens"] == 36e6
    (wish,) = [w for w in plan["request"]["wishes"] if w["wish"] == "money-budget"]
    assert wish["honoured"] is False and "no token count" not in wish["how"]
    assert "price" in wish["how"] and "/GPU-hour" in wish["how"]
