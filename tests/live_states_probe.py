"""Count the model-state bytes a live DeepSpeed ZeRO engine holds on each rank.

Standalone (torch, transformers, deepspeed and the standard library only); start it with the
DeepSpeed launcher, on CPU over gloo:

    python -m deepspeed.launcher.runner --num_gpus 2 --master_addr 127.0.0.1 \\
        --master_port P live_states_probe.py --model-config model.json \\
        --deepspeed_config ds.json --out DIR

It builds a random-init causal LM from ``model.json`` (fp32; under ``deepspeed.zero.Init``
for ZeRO-3, as tools/planning/memory.py assumes), runs one full training step so the optimizer
states exist, then the forward and backward of a second step, and counts what the engine
holds at that point (every model state is alive at once: the peak) and again after the
second ``step()``. Each rank writes ``DIR/rank{R}.json``.

Bytes are counted per storage (``untyped_storage()``), each storage once, so a flat buffer
that many parameters view is counted once, padding included, and a tensor that two places
share (e.g. ZeRO-3's fp32 "master" partition when the working weights are already fp32) is
counted once, under the first term that claims it, in the order params, master_params,
optimizer_moments, grads. ``aliased`` records the claims that were dropped that way.
``other`` is every other live tensor storage the garbage collector can see (communication
buckets, the data batch, caches).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import transformers

TERMS = ("params", "master_params", "optimizer_moments", "grads")
MOMENT_KEYS = ("exp_avg", "exp_avg_sq")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-config", required=True, type=Path)
    parser.add_argument("--deepspeed_config", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    return parser.parse_args()


def skip_shm_comm_build() -> None:
    """Skip JIT-building DeepSpeed's CPU shared-memory all-reduce op (tools/smoke/scripts/job_deepspeed.py)."""
    try:
        import deepspeed
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    except (ImportError, AttributeError, TypeError):
        pass


def storage_key(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Tensors in a tensor, a list/tuple or a dict of them (one level deep each)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        found: list[torch.Tensor] = []
        for item in value:
            found.extend(tensors_in(item))
        return found
    return []


def candidates(engine: Any, stage: int) -> list[tuple[str, str, torch.Tensor]]:
    """(term, where, tensor) for each model state (read off stage_1_and_2.py and stage3.py)."""
    zero = engine.optimizer
    model = engine.module
    params = list(model.parameters())
    found: dict[str, list[tuple[str, torch.Tensor]]] = {term: [] for term in TERMS}

    def add(term: str, where: str, tensors: Any) -> None:
        found[term].extend((where, t) for t in tensors_in(tensors) if t is not None)

    if stage == 3:
        # The partition each rank owns (views into fp16_partitioned_groups_flat), plus any
        # full weights that stay gathered (persistent small parameters).
        add("params", "ds_tensor", [p.ds_tensor for p in params])
        add("params", "gathered", [p.data for p in params if p.data.numel() > 0])
        add("master_params", "fp32_partitioned_groups_flat", zero.fp32_partitioned_groups_flat)
        add(
            "grads",
            "grad_partitions_flat_buffer",
            getattr(zero, "grad_partitions_flat_buffer", None),
        )
        add(
            "grads",
            "param_id_to_grad_partition",
            getattr(zero, "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition", {}),
        )
    else:
        # The working weights, which ZeRO-1/2 re-point into bit16_groups_flat.
        add("params", "param.data", [p.data for p in params])
        add("params", "bit16_groups_flat", zero.bit16_groups_flat)
        add(
            "master_params", "single_partition_of_fp32_groups", zero.single_partition_of_fp32_groups
        )
    add("grads", "master.grad", [m.grad for m in zero.optimizer.param_groups[0]["params"]])
    add("grads", "param.grad", [p.grad for p in params])
    add("grads", "param.grad_accum", [getattr(p, "grad_accum", None) for p in params])
    add("grads", "averaged_gradients", list(getattr(zero, "averaged_gradients", {}).values()))
    for state in zero.optimizer.state.values():
        add("optimizer_moments", "optimizer.state", [state[k] for k in MOMENT_KEYS if k in state])
    return [(term, where, t) for term in TERMS for where, t in found[term]]


def count(engine: Any, stage: int) -> dict[str, Any]:
    """Bytes per term, each storage counted once; plus every other live tensor storage."""
    gc.collect()
    seen: dict[tuple[int, int], str] = {}
    result: dict[str, Any] = {term: 0 for term in TERMS}
    aliased: dict[str, int] = {}
    where_bytes: dict[str, int] = {}
    for term, where, t in candidates(engine, stage):
        if t.device.type == "meta" or t.untyped_storage().nbytes() == 0:
            continue
        key = storage_key(t)
        if key in seen:
            if seen[key] != term:
                label = f"{term}->{seen[key]}"
                aliased[label] = aliased.get(label, 0) + key[1]
            continue
        seen[key] = term
        result[term] += key[1]
        label = f"{term}:{where}"
        where_bytes[label] = where_bytes.get(label, 0) + key[1]
    other = 0
    with warnings.catch_warnings():
        # isinstance() on some lazily imported modules' objects warns (deprecations).
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if not isinstance(obj, torch.Tensor) or obj.device.type == "meta":
                    continue
                key = storage_key(obj)
            except Exception:  # noqa: BLE001 - some tensor subclasses refuse storage access
                continue
            if key[1] and key not in seen:
                seen[key] = "other"
                other += key[1]
    # Gradient bytes per parameter whatever storage they sit in (a full gradient may be a
    # view into a communication bucket): numel x element size of each param.grad.
    result["param_grad_bytes"] = sum(
        p.grad.numel() * p.grad.element_size()
        for p in engine.module.parameters()
        if p.grad is not None
    )
    result["aliased"] = aliased
    result["where"] = where_bytes
    result["other"] = other
    return result


def main() -> int:
    args = parse_args()
    import deepspeed

    skip_shm_comm_build()
    ds_config = json.loads(args.deepspeed_config.read_text())
    stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
    model_cfg = dict(json.loads(args.model_config.read_text()))
    model_type = model_cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **model_cfg)

    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    torch.manual_seed(0)
    # Import what building the model imports (torch._dynamo via transformers' generation
    # utilities) before zero.Init patches torch.Tensor.__new__, which those imports reject.
    with torch.device("meta"):
        transformers.AutoModelForCausalLM.from_config(config)
    if stage == 3:
        # tools/planning/memory.py: "ZeRO-3 assumes the model is built under deepspeed.zero.Init".
        # No dtype argument: Init's _set_dtype (partition_parameters.py) takes the dtype from
        # the config (fp32 here) only when dtype is None; given one, an operator-precedence
        # slip there picks bf16 on the CPU accelerator whatever was passed.
        with deepspeed.zero.Init(config_dict_or_path=ds_config):
            model = transformers.AutoModelForCausalLM.from_config(config)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config).float()
    params = list(model.parameters())
    numel = sum(int(getattr(p, "ds_numel", p.numel())) for p in params)
    largest = max(
        sum(int(getattr(p, "ds_numel", p.numel())) for p in m.parameters(recurse=False))
        for m in model.modules()
    )

    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in params if p.requires_grad], config=ds_config
    )
    engine.train()
    gen = torch.Generator().manual_seed(1 + rank)
    batch = torch.randint(0, config.vocab_size, (1, args.seq_len), generator=gen)

    def forward_backward() -> None:
        loss = engine(input_ids=batch, labels=batch).loss
        engine.backward(loss)

    forward_backward()
    engine.step()
    # Also count as backward ends, before DeepSpeed reduces what is left and partitions the
    # gradients: where ZeRO keeps full gradients until then, this is when they peak.
    end_of_backward: dict[str, Any] = {}
    zero = engine.optimizer
    epilogue = getattr(zero, "independent_gradient_partition_epilogue", None)
    if epilogue is not None:

        def counted_epilogue(*a: Any, **kw: Any) -> Any:
            if not end_of_backward:
                end_of_backward.update(count(engine, stage))
            return epilogue(*a, **kw)

        zero.independent_gradient_partition_epilogue = counted_epilogue
    forward_backward()
    if epilogue is not None:
        del zero.independent_gradient_partition_epilogue
    after_backward = count(engine, stage)
    engine.step()
    after_step = count(engine, stage)

    report = {
        "rank": rank,
        "world_size": world,
        "stage": stage,
        "params_numel": numel,
        "largest_layer_params": largest,
        "param_dtype": str(params[0].dtype),
        "deepspeed": deepspeed.__version__,
        "end_of_backward": end_of_backward,
        "after_backward": after_backward,
        "after_step": after_step,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(report, indent=2))
    torch.distributed.barrier()
    print(f"rank {rank}: {json.dumps(after_backward)}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
