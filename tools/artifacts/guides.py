"""The guides for plans whose training script the user writes: HOROVOD.md, TF_CONFIG.md, FSDP.md.

train.py (tools/smoke/scripts/train.py) covers DeepSpeed and DDP only; these plans get a launch
command for the user's own script and a guide saying how to write it. The prose is in
templates/; this module fills in the plan's values.
"""

from __future__ import annotations

import json
import shlex

from tools.artifacts.scripts import render
from tools.core.schemas import HardwareSpec, ModelSpec
from tools.core.strategies import fsdp_sharding

TF_WORKER_PORT = 12345
_COVERAGE = (
    "trainwright's own train.py covers DeepSpeed, PyTorch DDP and FSDP only, so this plan has "
    "no generated training script: `{script}` is yours to write, and this guide says how."
)
_FSDP_COVERAGE = (
    "launch.sh runs the generated `{script}` in its FSDP2 mode (`--fsdp`, with the plan's "
    "sharding). To train with a script of your own instead, wrap the model as below."
)
# NO_SHARD, the plan's pick where a replica fits: launch.sh leaves out --fsdp (train_py_fsdp).
_FSDP_UNSHARDED_COVERAGE = (
    "launch.sh runs the generated `{script}` in its plain DDP mode, without `--fsdp`: the "
    "plan's setup fits on each device unsharded, and FSDP's NO_SHARD is DDP. To shard anyway, "
    "pass train.py's flags to launch.sh: `./launch.sh --fsdp --fsdp-sharding full`. To train "
    "with a script of your own instead, wrap the model as below."
)
# Decoder-layer classes for FSDP's transformer_auto_wrap_policy, by HF model_type.
_LAYER_CLASSES = {
    "gpt2": ("transformers.models.gpt2.modeling_gpt2", "GPT2Block"),
    "llama": ("transformers.models.llama.modeling_llama", "LlamaDecoderLayer"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "MistralDecoderLayer"),
    "mixtral": ("transformers.models.mixtral.modeling_mixtral", "MixtralDecoderLayer"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2DecoderLayer"),
    "gemma": ("transformers.models.gemma.modeling_gemma", "GemmaDecoderLayer"),
    "phi3": ("transformers.models.phi3.modeling_phi3", "Phi3DecoderLayer"),
    "gpt_neox": ("transformers.models.gpt_neox.modeling_gpt_neox", "GPTNeoXLayer"),
}
_SHARDING_NOTES = {
    "HYBRID_SHARD": (
        "HYBRID_SHARD shards parameters, gradients and optimizer state across the GPUs of "
        "one node and replicates across nodes, so the frequent all-gathers stay on the fast "
        "intra-node links. Switch to FULL_SHARD (shard across every GPU) when a replica "
        "does not fit in one node."
    ),
    "FULL_SHARD": (
        "FULL_SHARD shards parameters, gradients and optimizer state across all GPUs "
        "(ZeRO-3-like). On several nodes, HYBRID_SHARD keeps that sharding within a node "
        "and replicates across nodes."
    ),
    "SHARD_GRAD_OP": (
        "SHARD_GRAD_OP shards gradients and optimizer state and keeps whole parameters on "
        "every GPU (ZeRO-2-like; FSDP has no ZeRO-1 mode, and this one uses no more memory "
        "than the plan's ZeRO-1 or ZeRO-2 rows)."
    ),
    "NO_SHARD": (
        "NO_SHARD replicates everything, like DDP: the plan's data-parallel setup fits without "
        "sharding."
    ),
}


def horovod_md(
    command: list[str], hardware: HardwareSpec, gpus: int, script: str, keras: bool = False
) -> str:
    """HOROVOD.md: the horovodrun command and the five changes that port a PyTorch loop.

    ``keras``: a TensorFlow team's guide, which ports a Keras ``model.fit`` script with
    ``horovod.tensorflow.keras`` instead.
    """
    return render(
        "HOROVOD_KERAS.md" if keras else "HOROVOD.md",
        coverage=_COVERAGE.format(script=script),
        command=shlex.join(command),
        nodes=hardware.nodes,
        gpus=gpus,
        script=script,
    )


def tf_config_md(command: list[str], hardware: HardwareSpec, script: str) -> str:
    """TF_CONFIG.md: one TF_CONFIG per worker node and a minimal multi-worker Keras script."""
    workers = [f"node{i}:{TF_WORKER_PORT}" for i in range(hardware.nodes)]
    if hardware.nodes == 1:
        workers = [f"localhost:{TF_WORKER_PORT}"]
    blocks = []
    for index in range(len(workers)):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        blocks.append(
            f"Worker {index} (on `{workers[index].split(':')[0]}`):\n\n```json\n"
            f"{json.dumps(tf_config)}\n```\n"
        )
    example = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 0}}
    return render(
        "TF_CONFIG.md",
        coverage=_COVERAGE.format(script=script),
        workers="\n".join(blocks),
        example=json.dumps(example),
        command=shlex.join(command),
    )


def fsdp_md(
    command: list[str],
    hardware: HardwareSpec,
    model: ModelSpec,
    precision: str,
    script: str,
    strategy_name: str | None = None,
) -> str:
    """FSDP.md: the torchrun command and how to wrap the model (layer class, sharding, dtype).

    ``strategy_name``: the memory plan's chosen strategy, which picks the sharding mode
    (``fsdp_sharding``).
    """
    model_type = str((model.hf_config or {}).get("model_type", ""))
    module, layer = _LAYER_CLASSES.get(
        model_type, ("transformers.models.llama.modeling_llama", "LlamaDecoderLayer")
    )
    layer_note = (
        f"`{layer}` is {model.name}'s decoder layer."
        if model_type in _LAYER_CLASSES
        else f"Replace `{layer}` with the decoder-layer class of {model.name}."
    )
    strategy, offload = fsdp_sharding(strategy_name, hardware.nodes)
    coverage = _FSDP_UNSHARDED_COVERAGE if strategy == "NO_SHARD" else _FSDP_COVERAGE
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(precision)
    if dtype is None:
        mixed_precision = "mixed = None  # the plan trains in fp32"
    else:
        mixed_precision = (
            f"mixed = MixedPrecision(param_dtype={dtype}, reduce_dtype={dtype}, "
            f"buffer_dtype={dtype})"
        )
    scaler_note = (
        "\n\nWith fp16, scale the loss with "
        "`torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler`."
        if precision == "fp16"
        else ""
    )
    return render(
        "FSDP.md",
        coverage=coverage.format(script=script),
        command=shlex.join(command),
        nodes=hardware.nodes,
        module=module,
        layer=layer,
        mixed_precision=mixed_precision,
        strategy=strategy,
        offload=str(offload),
        layer_note=layer_note,
        strategy_note=_SHARDING_NOTES[strategy]
        + (
            " Parameters and gradients live on the CPU between uses (the plan's offload row)."
            if offload
            else ""
        ),
        scaler_note=scaler_note,
    )
