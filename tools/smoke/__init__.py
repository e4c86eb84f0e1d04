"""Stage 4, proof: the short real training run of a planned setup on this machine.

It shows the setup starts, fits and learns; scripts/ holds the standalone scripts it launches.
"""

from tools.smoke.commands import free_port, launch_commands
from tools.smoke.ds_adapt import adapt_ds_config, smoke_lr
from tools.smoke.groups import group_alive, group_rss_bytes
from tools.smoke.memory_cap import default_memory_cap, format_bytes
from tools.smoke.predict import predict_peak_bytes, shape_spec, smoke_mfu, with_prediction
from tools.smoke.runner import run_smoke_test
from tools.smoke.scale import llama_config_from_shape, scale_model_config
from tools.smoke.spec import (
    DeepSpeedRun,
    LayoutRun,
    SmokeMode,
    SmokeSpec,
    TensorFlowRun,
    TorchrunRun,
)
from tools.smoke.stopping import (
    Terminated,
    clear_stop,
    kill_child_groups,
    request_stop,
    stop_all_runs,
    stop_on_sigterm,
    stop_requested,
    stop_runs_in_thread,
    stop_runs_on_interrupt,
)
from tools.smoke.verdict import step_times_s

__all__ = [
    "DeepSpeedRun",
    "LayoutRun",
    "SmokeMode",
    "SmokeSpec",
    "TensorFlowRun",
    "Terminated",
    "TorchrunRun",
    "adapt_ds_config",
    "clear_stop",
    "default_memory_cap",
    "format_bytes",
    "free_port",
    "group_alive",
    "group_rss_bytes",
    "kill_child_groups",
    "launch_commands",
    "llama_config_from_shape",
    "predict_peak_bytes",
    "request_stop",
    "run_smoke_test",
    "scale_model_config",
    "shape_spec",
    "smoke_lr",
    "smoke_mfu",
    "step_times_s",
    "stop_all_runs",
    "stop_on_sigterm",
    "stop_requested",
    "stop_runs_in_thread",
    "stop_runs_on_interrupt",
    "with_prediction",
]
