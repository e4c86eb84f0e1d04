"""What GPUs this machine has, without torch: NVML, else ``nvidia-smi``, else ``rocm-smi``.

torch only sees GPUs its build supports (a CPU-only wheel sees none on an 8-GPU node), so
the profile asks the driver directly. Every outside call goes through two injectable seams,
``run(argv) -> stdout`` and an NVML module object, so tests feed recorded outputs
(``tests/data/gpu/``) instead of needing a GPU.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from itertools import combinations
from typing import Any, Literal

from pydantic import BaseModel, Field

Runner = Callable[[Sequence[str]], str]
"""Runs an argument list and returns its stdout; raises ``ProbeError`` (or OSError) if it cannot."""

TIMEOUT_S = 10.0

SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=name,memory.total,compute_cap,driver_version",
    "--format=csv,noheader,nounits",
]
SMI_QUERY_OLD = [
    "nvidia-smi",
    "--query-gpu=name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
]
SMI_HEADER = ["nvidia-smi"]
SMI_TOPO = ["nvidia-smi", "topo", "-m"]
ROCM_SMI = [
    "rocm-smi",
    "--showproductname",
    "--showmeminfo",
    "vram",
    "--showdriverversion",
    "--json",
]

# nvidia-smi topo -m legend: NV# is a bonded set of # NVLinks; the rest are PCIe paths, from
# the shortest (PIX, one bridge) to the longest (SYS, across the CPU socket interconnect).
# SOC is what drivers before 384 called SYS.
PCIE_PATHS = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS", "SOC"})
_NV_RE = re.compile(r"^NV(\d+)$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_LABEL_RE = re.compile(r"^GPU(\d+)$")


class ProbeError(RuntimeError):
    """A probe command is missing, timed out or failed."""


class CommandFailed(ProbeError):
    """A probe command ran and exited non-zero."""


class GPUDevice(BaseModel):
    """One GPU as the driver reports it."""

    index: int
    name: str
    vendor: Literal["nvidia", "amd"]
    memory_gb: float = Field(description="total memory in GiB, as the driver reports it")
    compute_capability: str | None = Field(
        default=None, description="CUDA compute capability ('9.0'); the gfx target on AMD"
    )


class GPULink(BaseModel):
    """How one pair of GPUs is connected."""

    gpus: tuple[int, int]
    kind: Literal["nvlink", "pcie", "unknown"]
    path: str = Field(description="the topo -m cell: NV18, PIX, PXB, PHB, NODE, SYS")
    nvlinks: int = Field(default=0, description="bonded NVLinks between the pair (NV#)")


class GPUTopology(BaseModel):
    """GPU-to-GPU links inside this machine (``nvidia-smi topo -m``)."""

    source: str
    gpu_count: int
    links: list[GPULink] = Field(default_factory=list)

    @property
    def all_nvlink(self) -> bool:
        """True when there are at least two GPUs and every pair is NVLink-connected."""
        pairs = self.gpu_count * (self.gpu_count - 1) // 2
        nvlinked = sum(1 for link in self.links if link.kind == "nvlink")
        return pairs > 0 and nvlinked == pairs


class GPUProbe(BaseModel):
    """What the driver tools said about this machine's GPUs, and why a source gave nothing."""

    source: Literal["nvml", "nvidia-smi", "rocm-smi"] | None = None
    gpus: list[GPUDevice] = Field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = Field(
        default=None, description="the newest CUDA the driver supports (not torch's build)"
    )
    topology: GPUTopology | None = None
    notes: list[str] = Field(default_factory=list)

    def summary(self) -> str:
        """One line: the GPUs found, or 'no GPU' and why."""
        if not self.gpus:
            why = "; ".join(self.notes)
            return "no GPU found" + (f" ({why})" if why else "")
        names: dict[str, int] = {}
        for gpu in self.gpus:
            names[gpu.name] = names.get(gpu.name, 0) + 1
        parts = [f"{count}x {name}" for name, count in names.items()]
        return f"{', '.join(parts)} (via {self.source})"


_BUILD_LINE_RE = re.compile(r"^(cuda|hip)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)


def torch_may_see_gpus() -> bool:
    """False only when the installed torch certainly sees no GPU: a CPU-only build.

    Answered from the build's ``torch/version.py`` (``cuda``/``hip`` both None) without
    importing torch (seconds), so a CPU machine asks torch nothing. True when torch is already
    imported (asking it then costs nothing, and what it says wins), when the file cannot be
    read, or for a CUDA or ROCm build. Not installed: False.
    """
    if "torch" in sys.modules:
        return True
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    if not spec.submodule_search_locations:
        return True
    try:
        with open(f"{list(spec.submodule_search_locations)[0]}/version.py") as fh:
            text = fh.read()
    except OSError:
        return True
    builds = dict(_BUILD_LINE_RE.findall(text))
    if set(builds) != {"cuda", "hip"}:
        return True  # a layout we do not know: ask torch
    return any(value != "None" for value in builds.values())


def run_command(argv: Sequence[str], timeout_s: float = TIMEOUT_S) -> str:
    """Run ``argv`` (no shell) and return stdout; raise ProbeError if it is missing or fails."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except FileNotFoundError as exc:
        raise ProbeError(f"{argv[0]}: not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(f"{argv[0]}: no answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise ProbeError(f"{argv[0]}: {exc.strerror or exc}") from exc
    if done.returncode != 0:
        # nvidia-smi prints its reason on stdout ("NVIDIA-SMI has failed because ...").
        reason = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise CommandFailed(
            f"{argv[0]}: exit {done.returncode}" + (f": {reason[0][:200]}" if reason else "")
        )
    return done.stdout


def load_nvml() -> Any | None:
    """The ``pynvml`` module (nvidia-ml-py), or None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def probe_gpus(run: Runner = run_command, nvml: Any | None | Literal["auto"] = "auto") -> GPUProbe:
    """Ask the driver what GPUs this machine has, trying NVML, nvidia-smi, then rocm-smi.

    Args:
        run: Runs an argument list and returns stdout (``run_command``); tests pass recorded
            outputs.
        nvml: The ``pynvml`` module or a stand-in; ``"auto"`` imports it when installed,
            None skips NVML.

    Never raises for a missing tool or driver: the reasons land in ``notes``.
    """
    probe = GPUProbe()
    module = load_nvml() if nvml == "auto" else nvml
    if module is None:
        probe.notes.append("NVML: nvidia-ml-py not installed")
    else:
        _from_nvml(module, probe)
    if not probe.gpus:
        _from_nvidia_smi(run, probe)
    if probe.gpus and probe.gpus[0].vendor == "nvidia":
        try:
            probe.topology = parse_topology(run(SMI_TOPO))
        except (ProbeError, OSError) as exc:
            probe.notes.append(f"topology: {exc}")
        if probe.topology is not None and probe.topology.gpu_count != len(probe.gpus):
            # CUDA_VISIBLE_DEVICES does not restrict topo -m; a mismatch means the matrix
            # describes other GPUs than the ones counted, so it is not evidence about them.
            probe.notes.append(
                f"topology: topo -m shows {probe.topology.gpu_count} GPUs, "
                f"{len(probe.gpus)} probed; ignored"
            )
            probe.topology = None
    if not probe.gpus:
        _from_rocm_smi(run, probe)
    return probe


def _note(tool: str, exc: Exception) -> str:
    """Why ``tool`` gave nothing; ``run_command``'s messages already start with the tool name."""
    text = str(exc)
    return text if text.startswith(f"{tool}:") else f"{tool}: {text}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _from_nvml(nvml: Any, probe: GPUProbe) -> None:
    # Any NVML failure (no driver, no library, a GPU that fell off the bus) means "ask
    # nvidia-smi instead"; pynvml raises NVMLError subclasses, ctypes raises OSError.
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - see above
        probe.notes.append(f"NVML: {exc}")
        return
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(
                GPUDevice(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    vendor="nvidia",
                    memory_gb=round(nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30, 1),
                    compute_capability=f"{major}.{minor}",
                )
            )
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = _cuda_from_int(nvml.nvmlSystemGetCudaDriverVersion())
    except Exception as exc:  # noqa: BLE001 - any NVML failure: fall back to nvidia-smi
        probe.notes.append(f"NVML: {exc}")
        return
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down is best effort
            pass
    probe.source, probe.gpus, probe.driver_version, probe.cuda_version = "nvml", gpus, driver, cuda


def _cuda_from_int(version: int) -> str | None:
    """NVML's 12040 is CUDA 12.4 (the ``CUDA_VERSION`` encoding, 1000*major + 10*minor)."""
    if version <= 0:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def _from_nvidia_smi(run: Runner, probe: GPUProbe) -> None:
    try:
        gpus, driver = _smi_query(run)
    except (ProbeError, OSError, ValueError) as exc:
        probe.notes.append(_note("nvidia-smi", exc))
        return
    if not gpus:
        probe.notes.append("nvidia-smi: no GPUs listed")
        return
    probe.source, probe.gpus, probe.driver_version = "nvidia-smi", gpus, driver
    try:
        probe.cuda_version = parse_smi_cuda_version(run(SMI_HEADER))
    except (ProbeError, OSError) as exc:
        probe.notes.append(f"CUDA version: {exc}")


def _smi_query(run: Runner) -> tuple[list[GPUDevice], str | None]:
    try:
        return parse_smi_query(run(SMI_QUERY))
    except CommandFailed:
        # Drivers before ~510 reject the compute_cap field; ask again without it.
        return parse_smi_query(run(SMI_QUERY_OLD), with_compute_cap=False)


def parse_smi_query(text: str, with_compute_cap: bool = True) -> tuple[list[GPUDevice], str | None]:
    """GPUs and the driver version from ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``.

    Raises:
        ValueError: When a line does not have the queried fields.
    """
    gpus: list[GPUDevice] = []
    driver: str | None = None
    width = 4 if with_compute_cap else 3
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != width:
            raise ValueError(f"unexpected query line {line.strip()[:80]!r}")
        name, memory_mib = cells[0], cells[1]
        cap = cells[2] if with_compute_cap else None
        gpus.append(
            GPUDevice(
                index=len(gpus),
                name=name,
                vendor="nvidia",
                memory_gb=round(float(memory_mib) / 1024, 1),
                compute_capability=cap if cap and cap != "[N/A]" else None,
            )
        )
        driver = cells[-1]
    return gpus, driver


def parse_smi_cuda_version(text: str) -> str | None:
    """The "CUDA Version: 12.4" of plain ``nvidia-smi``'s header box."""
    match = re.search(r"CUDA Version:\s*([0-9][0-9.]*)", text)
    return match[1] if match else None


def parse_topology(text: str) -> GPUTopology | None:
    """GPU pairs and their links from ``nvidia-smi topo -m``; None when there is no matrix.

    Rows and columns are GPU<n> (NIC rows and affinity columns are ignored); a cell is X
    (self), NV# (# bonded NVLinks) or a PCIe path (PIX, PXB, PHB, NODE, SYS).
    """
    header: list[str] | None = None
    rows: dict[int, list[str]] = {}
    for line in text.splitlines():
        # Some releases underline the header row with ANSI escapes, even into a pipe.
        tokens = _ANSI_RE.sub("", line).split()
        label = _GPU_LABEL_RE.match(tokens[0]) if tokens else None
        if label is None:
            continue
        # The header row lists GPU0 GPU1 ...; the GPU0 row has X (self) in its GPU0 column.
        if header is None and label[1] == "0" and tokens[1:2] != ["X"]:
            header = tokens
        elif header is not None:
            rows[int(label[1])] = tokens[1:]
    if header is None:
        return None
    columns = [int(m[1]) for token in header if (m := _GPU_LABEL_RE.match(token))]
    links: list[GPULink] = []
    for a, b in combinations(sorted(rows), 2):
        cells = rows[a]
        if b not in columns or columns.index(b) >= len(cells):
            continue
        links.append(_link(a, b, cells[columns.index(b)]))
    return GPUTopology(source="nvidia-smi topo -m", gpu_count=len(rows), links=links)


def _link(a: int, b: int, cell: str) -> GPULink:
    nv = _NV_RE.match(cell)
    if nv:
        return GPULink(gpus=(a, b), kind="nvlink", path=cell, nvlinks=int(nv[1]))
    kind: Literal["pcie", "unknown"] = "pcie" if cell in PCIE_PATHS else "unknown"
    return GPULink(gpus=(a, b), kind=kind, path=cell)


def _from_rocm_smi(run: Runner, probe: GPUProbe) -> None:
    try:
        gpus, driver = parse_rocm_smi(run(ROCM_SMI))
    except (ProbeError, OSError, ValueError) as exc:
        probe.notes.append(_note("rocm-smi", exc))
        return
    if not gpus:
        probe.notes.append("rocm-smi: no GPUs listed")
        return
    probe.source, probe.gpus, probe.driver_version = "rocm-smi", gpus, driver


def parse_rocm_smi(text: str) -> tuple[list[GPUDevice], str | None]:
    """GPUs and the driver version from ``rocm-smi --showproductname --showmeminfo vram --json``.

    Key spellings vary across ROCm releases ("Card series" / "Card Series"), so keys are
    matched without regard to case.

    Raises:
        ValueError: When the output is not JSON.
    """
    # Some releases print warnings before the JSON object.
    start = text.find("{")
    try:
        data = json.loads(text[start:]) if start >= 0 else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"output is not JSON: {exc.msg}") from exc
    gpus: list[GPUDevice] = []
    driver: str | None = None
    cards = sorted(
        (
            (int(m[1]), fields)
            for key, fields in data.items()
            if (m := re.match(r"card(\d+)$", key))
        ),
        key=lambda item: item[0],
    )
    for index, fields in cards:
        lower = {str(k).strip().lower(): str(v).strip() for k, v in fields.items()}
        name = (
            lower.get("card series") or lower.get("marketing name") or lower.get("card model") or ""
        )
        memory_b = lower.get("vram total memory (b)")
        gpus.append(
            GPUDevice(
                index=index,
                name=name or f"AMD GPU {index}",
                vendor="amd",
                memory_gb=round(int(memory_b) / 2**30, 1)
                if memory_b and memory_b.isdigit()
                else 0.0,
                compute_capability=lower.get("gfx version") or None,
            )
        )
    system = data.get("system")
    if isinstance(system, dict):
        driver = next((str(v) for k, v in system.items() if k.lower() == "driver version"), None)
    return gpus, driver
