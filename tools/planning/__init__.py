"""Stage 3, the numbers: memory and speed estimates, and the one strategy search.

Estimates are arithmetic on the model and hardware; search.py is the only place a setup is chosen.
"""

from tools.planning.activations import activation_bytes
from tools.planning.memory import capacity_bytes, estimate_strategy
from tools.planning.options import SearchOptions
from tools.planning.overheads import node_ram_bytes
from tools.planning.parallel import (
    check_model_parallel,
    data_parallel_size,
    model_parallel_params,
    model_parallel_setups,
)
from tools.planning.search import search_strategy
from tools.planning.sizing import SizingLimits, size_training
from tools.planning.speed import estimate_speed, training_flops_per_token
from tools.planning.states import (
    ModelStates,
    ZeroSettings,
    lora_adapter_params,
    model_state_bytes,
    resolve_precision,
    zero_settings,
)

__all__ = [
    "ModelStates",
    "SearchOptions",
    "SizingLimits",
    "ZeroSettings",
    "activation_bytes",
    "capacity_bytes",
    "check_model_parallel",
    "data_parallel_size",
    "estimate_speed",
    "estimate_strategy",
    "lora_adapter_params",
    "model_parallel_params",
    "model_parallel_setups",
    "model_state_bytes",
    "node_ram_bytes",
    "resolve_precision",
    "search_strategy",
    "size_training",
    "training_flops_per_token",
    "zero_settings",
]
