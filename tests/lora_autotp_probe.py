"""What DeepSpeed AutoTP training does to a PEFT LoRA model: which modules and parameters remain.

Standalone (torch, transformers, peft, deepspeed and the standard library only); start it with
the DeepSpeed launcher, on CPU over gloo:

    python -m deepspeed.launcher.runner --num_gpus 2 --master_addr 127.0.0.1 \\
        --master_port P lora_autotp_probe.py --model-config model.json \\
        --deepspeed_config ds.json --out DIR

It builds a random-init causal LM from ``model.json``, wraps it with peft LoRA on every linear
projection (as tools/smoke/scripts/job_model.py ``add_lora`` does), hands it to
``deepspeed.initialize`` with the config's ``tensor_parallel.autotp_size``, and records on each
rank the class of every module and the shape and ``requires_grad`` of every parameter before and
after, then whether a forward and backward of one batch ran. Each rank writes ``DIR/rank{R}.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import deepspeed
import peft
import torch
import transformers


def _params(model: torch.nn.Module) -> dict[str, Any]:
    return {n: [list(p.shape), p.requires_grad] for n, p in model.named_parameters()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-config", type=Path, required=True)
    parser.add_argument("--deepspeed_config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    try:  # the CPU shared-memory all-reduce op: inference only (tools/smoke/scripts/job_deepspeed.py)
        from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

        deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
    except (ImportError, AttributeError, TypeError):
        pass
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    cfg = json.loads(args.model_config.read_text())
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = transformers.AutoModelForCausalLM.from_config(config)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lora)
    report: dict[str, Any] = {
        "rank": rank,
        "before": _params(model),
        "deepspeed": deepspeed.__version__,
    }
    try:
        engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=json.loads(args.deepspeed_config.read_text()),
        )
        report["initialized"] = True
    except Exception as exc:  # what stops it is the finding
        report["initialized"] = False
        report["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        report["trace"] = traceback.format_exc()[-2000:]
    report["after"] = _params(model)
    report["modules"] = {n: type(m).__name__ for n, m in model.named_modules()}
    if report["initialized"]:
        batch = torch.randint(
            0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1)
        )
        loss = engine(input_ids=batch, labels=batch).loss
        report["loss_requires_grad"] = bool(loss.requires_grad)
        try:
            engine.backward(loss)
            engine.step()
            report["stepped"] = True
        except Exception as exc:
            report["stepped"] = False
            report["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    code = main()
    # A rank whose initialize failed leaves gloo's threads running; tearing them down at
    # interpreter exit can abort the process ("terminate called without an active exception",
    # exit -6) after the report is written: leave at once with the report's code.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
