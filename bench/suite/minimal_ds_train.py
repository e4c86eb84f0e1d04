"""A minimal hand-written DeepSpeed training script: the baseline for the smoke-run overhead.

The same model config, DeepSpeed config, steps, batch and sequence length as a smoke run
(bench/suite/smoke_overhead.py passes the smoke run's own files), none of the smoke script's extras:
no metrics, no peak sampling, no progress lines, no fault injection.
"""

import argparse
import json

import deepspeed
import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("--model-config", required=True)
parser.add_argument("--deepspeed_config", required=True)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--seq-len", type=int, default=64)
parser.add_argument("--micro-batch", type=int, default=1)
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()

cfg = json.load(open(args.model_config))
model_type = cfg.pop("model_type")
model = transformers.AutoModelForCausalLM.from_config(
    transformers.AutoConfig.for_model(model_type, **cfg)
)
engine, _, _, _ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=json.load(open(args.deepspeed_config))
)
vocab = model.config.vocab_size
for _ in range(args.steps):
    batch = torch.randint(0, vocab, (args.micro_batch, args.seq_len), device=engine.device)
    loss = engine(input_ids=batch, labels=batch).loss
    engine.backward(loss)
    engine.step()
# Without this, gloo's threads can abort the interpreter at exit ("terminate called ...").
torch.distributed.destroy_process_group()
