"""What a rank measures and what it breaks: its memory peak, and the faults ``--inject`` sets.

``--inject oom|nan|hang|crash|alloc`` (with ``--inject-step N``) makes the run fail for real at
step N, to test whatever supervises it: ``oom`` caps the memory just above what the process
holds (an address-space limit on CPU, ``torch.cuda.set_per_process_memory_fraction`` on GPU)
and gives that step a 16x batch; ``nan`` turns the input embeddings' output into NaN; ``hang``,
``crash`` and ``alloc`` are the scripts' shared faults (harness.py ``Faults``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from harness import Faults, anon_rss_bytes, cap_address_space, lift_cap, peak_rss_bytes
from job_model import build_model

# The oom injection: bytes left above what the process holds, and the batch multiplier.
_OOM_MARGIN_BYTES = 1 << 20
_OOM_BATCH_FACTOR = 16


class CpuPeak:
    """The peak of this process's anonymous resident memory (heap), sampled during training.

    On CPU a rank's tensors live in anonymous memory (``RssAnon`` in /proc/self/status), while
    the libraries' code pages that the first steps touch show up in file-backed RSS; the
    kernel's own high-water mark (``VmHWM``) mixes both. Samples are taken after each forward,
    backward and optimizer step, where parameters, gradients, optimizer states and activations
    peak together. 0 where /proc is unavailable.
    """

    peak = 0
    enabled = False

    @classmethod
    def sample(cls) -> int:
        """Read RssAnon now and keep the maximum."""
        now = anon_rss_bytes()
        cls.peak = max(cls.peak, now)
        return now


def cpu_baseline_bytes(model_config: dict[str, Any]) -> int:
    """Anonymous memory before the model exists, with the model's code already imported.

    Building the model once on the meta device imports its modeling code (for a small model
    that import holds more memory than the weights), so the baseline leaves it out.
    """
    with torch.device("meta"):
        build_model(model_config)
    CpuPeak.peak = 0
    CpuPeak.enabled = True
    return anon_rss_bytes()


def sample() -> None:
    """Sample the CPU memory peak (a no-op on GPU, where torch tracks the peak itself)."""
    if CpuPeak.enabled:
        CpuPeak.sample()


def peak_memory_bytes(device: torch.device) -> int:
    """Peak accelerator memory on CUDA, else this process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if CpuPeak.peak:
        return CpuPeak.peak
    return peak_rss_bytes()


def process_gpu_memory_bytes(device: torch.device) -> int | None:
    """This process's memory on its GPU as the driver sees it (NVML), or None where unavailable.

    It includes the CUDA context and the caching allocator's reserved blocks, which
    ``max_memory_allocated`` leaves out. NVML comes with nvidia-ml-py (a DeepSpeed dependency);
    without it, or where the driver does not report per-process use, this returns None.
    """
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            handle = None
            for i in range(pynvml.nvmlDeviceGetCount()):
                candidate = pynvml.nvmlDeviceGetHandleByIndex(i)
                found = pynvml.nvmlDeviceGetUUID(candidate)
                found = found.decode() if isinstance(found, bytes) else str(found)
                if found.replace("GPU-", "") == uuid.replace("GPU-", ""):
                    handle = candidate
                    break
            if handle is None:
                return None
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory:
                    return int(proc.usedGpuMemory)
            return None
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML is an extra reading: any failure just means "not measured"
        return None


class FaultInjector(Faults):
    """The shared faults, plus train.py's own: oom (a capped memory and a 16x batch) and nan."""

    def __init__(self, kind: str | None, step: int, rank: int, world_size: int) -> None:
        super().__init__(kind, step, rank, world_size)
        self._cpu_limit: tuple[int, int] | None = None

    def batch(self, step: int, batch: torch.Tensor) -> torch.Tensor:
        """The batch for ``step``: 16 copies of it at the oom step."""
        if self.kind == "oom" and step == self.step:
            return batch.repeat(_OOM_BATCH_FACTOR, 1)
        return batch

    def before_step(self, step: int, model: torch.nn.Module, device: torch.device) -> None:
        """Arm the fault due at ``step``."""
        if not self.due(step):
            return
        self.fire(step)
        if self.kind == "nan":
            embeddings: torch.nn.Module = model.get_input_embeddings()  # type: ignore[operator]
            embeddings.register_forward_hook(lambda _m, _i, out: out * float("nan"))
        if self.kind == "oom":
            self._cap_memory(device)

    def _cap_memory(self, device: torch.device) -> None:
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            held = torch.cuda.memory_reserved(device) + _OOM_MARGIN_BYTES
            torch.cuda.set_per_process_memory_fraction(min(1.0, held / total), device)
            return
        self._cpu_limit = cap_address_space(_OOM_MARGIN_BYTES)

    def release(self) -> None:
        """Lift the CPU cap again (so the error's traceback can still be printed)."""
        if self._cpu_limit is not None:
            lift_cap(self._cpu_limit)
            self._cpu_limit = None


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is running out of GPU or host memory."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return "out of memory" in text or "can't allocate memory" in text
