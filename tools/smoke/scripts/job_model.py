"""The model a run trains: built from a config or loaded from weights, LoRA adapters, counts.

``--init random`` (the default) builds from ``--model-config`` (a Hugging Face config.json);
``--init pretrained --model-path PATH`` loads a local folder or a hub id with
``from_pretrained`` in the run's dtype (the hub needs the network on the training machine).
``--lora-rank R`` trains LoRA adapters only (peft; ``--lora-targets all-linear`` by default:
every linear projection of every layer) with the base frozen; ``--qlora`` also loads the base
in 4-bit NF4 (bitsandbytes, CUDA only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

import torch
import transformers
from harness import UsageError

# Config keys that count a mixture-of-experts model's routed experts.
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
# transformers' MoE models (Mixtral, Qwen2-MoE, OLMoE, ...) add the router's load-balancing loss
# (router_aux_loss_coef x aux loss, Switch Transformer's) to the training loss only when the
# config's output_router_logits is on, and their released configs turn it off (inference).
_ROUTER_LOSS_SWITCH = "output_router_logits"
_ROUTER_LOSS_COEF = "router_aux_loss_coef"


def training_overrides(config_dict: dict[str, Any]) -> dict[str, Any]:
    """Config values training needs that a released config may lack: the router's balance loss.

    Without it a mixture of experts trains on the language-model loss alone and its router
    may send most tokens to a few experts. Empty for a model with no such switch.
    """
    coef = config_dict.get(_ROUTER_LOSS_COEF)
    if _ROUTER_LOSS_SWITCH in config_dict and isinstance(coef, int | float) and coef > 0:
        return {_ROUTER_LOSS_SWITCH: True}
    return {}


def model_config_dict(args: argparse.Namespace) -> dict[str, Any]:
    """The model's config.json: ``--model-config``, else the one ``--model-path`` holds."""
    if args.model_config is not None:
        return dict(json.loads(args.model_config.read_text()))
    config = transformers.AutoConfig.from_pretrained(args.model_path)
    return dict(config.to_dict())


def build_model(
    config_dict: dict[str, Any],
    attn_implementation: str | None = None,
    dtype: torch.dtype | None = None,
) -> transformers.PreTrainedModel:
    """Build a random-init causal LM from a Hugging Face config dict (no download).

    Under an active ``HfDeepSpeedConfig`` with ZeRO-3 (``zero3_context``) transformers builds it
    inside ``deepspeed.zero.Init``: each parameter is partitioned as it is created.
    """
    cfg = dict(config_dict) | training_overrides(config_dict)
    model_type = cfg.pop("model_type")
    for key in ("architectures", "transformers_version", "torch_dtype", "dtype"):
        cfg.pop(key, None)
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    kwargs: dict[str, Any] = {}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if dtype is not None:
        kwargs["dtype"] = dtype
    return transformers.AutoModelForCausalLM.from_config(config, **kwargs)


def load_model(
    args: argparse.Namespace,
    config_dict: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device | None,
) -> transformers.PreTrainedModel:
    """The model the run trains: random init or ``--model-path``'s weights, in ``dtype``.

    ``device`` is where the weights are created (None: where transformers puts them, which
    under ZeRO-3 is the partitioned home DeepSpeed picks).
    """
    where = torch.device(device) if device is not None else contextlib.nullcontext()
    if args.init == "random":
        with where:
            return build_model(config_dict, args.attn_implementation, dtype)
    kwargs: dict[str, Any] = {"dtype": dtype, **training_overrides(config_dict)}
    if args.attn_implementation:
        kwargs["attn_implementation"] = args.attn_implementation
    if args.qlora:
        kwargs["quantization_config"] = qlora_config(dtype)
        # bitsandbytes quantizes as it loads, on this rank's GPU (ZeRO-3 leaves quantized
        # models whole: transformers skips zero.Init for them).
        kwargs["device_map"] = {"": device if device is not None else torch.cuda.current_device()}
        return transformers.AutoModelForCausalLM.from_pretrained(args.model_path, **kwargs)
    with where:
        return transformers.AutoModelForCausalLM.from_pretrained(args.model_path, **kwargs)


def qlora_config(compute_dtype: torch.dtype) -> Any:
    """4-bit NF4 with double quantization (Dettmers et al. 2023), bitsandbytes on CUDA only."""
    if not torch.cuda.is_available():
        raise UsageError(
            "--qlora needs a CUDA GPU (bitsandbytes' 4-bit kernels); this machine has none"
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise UsageError("--qlora needs bitsandbytes: pip install bitsandbytes") from exc
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
        # Stored as the compute dtype, so ZeRO-3 and FSDP can shard the packed weights.
        bnb_4bit_quant_storage=compute_dtype,
    )


def add_lora(args: argparse.Namespace, model: torch.nn.Module) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (``--lora-rank``); the base is frozen. No-op without."""
    if not args.lora_rank:
        return model
    try:
        import peft
    except ImportError as exc:
        raise UsageError("--lora-rank needs peft: pip install peft") from exc
    if args.qlora:
        model = peft.prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=args.gradient_checkpointing
        )
    targets: str | list[str] = args.lora_targets
    if args.lora_targets != "all-linear":
        targets = [name.strip() for name in args.lora_targets.split(",") if name.strip()]
    config = peft.LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha if args.lora_alpha is not None else 2 * args.lora_rank,
        lora_dropout=args.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)


def enable_checkpointing(args: argparse.Namespace, model: Any) -> None:
    """Recompute each layer in backward; LoRA needs the non-reentrant form (frozen inputs)."""
    kwargs = {"use_reentrant": False} if args.lora_rank else None
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def trainable_params(model: torch.nn.Module) -> int:
    """Parameters the optimizer updates (ZeRO-3 partitions report their full size)."""
    return sum(_numel(p) for p in model.parameters() if p.requires_grad)


def total_params(model: torch.nn.Module) -> int:
    """Every parameter, at its full size also where ZeRO-3 or FSDP shards it."""
    return sum(_numel(p) for p in model.parameters())


def local_param_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters this rank holds: its ZeRO-3 partition or FSDP shard, else all of it."""
    total = 0
    for param in model.parameters():
        local: Any = getattr(param, "ds_tensor", None)  # a ZeRO-3 partition
        if local is None:
            to_local = getattr(param, "to_local", None)  # an FSDP2 DTensor shard
            local = to_local() if callable(to_local) else param
        total += int(local.numel()) * int(local.element_size())
    return total


def _numel(param: torch.nn.Parameter) -> int:
    ds_numel = getattr(param, "ds_numel", None)  # a ZeRO-3 partition's full size
    if isinstance(ds_numel, int):
        return ds_numel
    return int(param.numel())  # a DTensor (FSDP2) reports its global size


def has_experts(model: torch.nn.Module) -> bool:
    """Whether the model routes tokens to experts (so a step may leave some weights unused)."""
    config = getattr(model, "config", None)
    for key in _EXPERT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return True
    return False


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the longest ModuleList of one module class."""
    best: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best):
            children = list(module)
            if len({type(child) for child in children}) == 1:
                best = children
    return best
