"""Hardware facts: the GPU catalog, cluster specs such as ``2x8xH100-80GB``, and this machine.

Datasheet numbers live in ``knowledge/gpus.yaml``; this module only reads and matches them, so
a correction to a figure is a data change, not a code change.
"""

from __future__ import annotations

import difflib
import os
import platform
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from tools.core.errors import InputError
from tools.core.schemas import GPUSpec, HardwareSpec, TrainingBrief
from tools.research import gpu_probe
from tools.research.gpu_probe import GPUDevice, GPUProbe, GPUTopology

INTERCONNECTS = ("ib400", "ib200", "roce100", "eth25", "nvlink")
"""Inter-node networks a user may name: InfiniBand NDR/HDR, RoCE 100G, 25G Ethernet, NVLink."""

MAX_NODES = 4096
MAX_GPUS_PER_NODE = 16

SPEC_EXAMPLE = (
    "expected NODESxGPUSxTYPE or GPUSxTYPE, e.g. '1x8xA100-80GB', '2x8xH100-80GB' or 'local'"
)

# Dropped before matching so that torch's "NVIDIA GeForce RTX 4090" finds "RTX4090".
_VENDOR_WORDS = frozenset({"nvidia", "tesla", "geforce", "amd", "instinct", "radeon"})

# "x" (or "×") separates counts from the type; the type itself may contain an x (MI300X).
_CLUSTER_RE = re.compile(r"^\s*(\d+)\s*[x×]\s*(\d+)\s*[x×]\s*(\S.*?)\s*$", re.IGNORECASE)
_SINGLE_NODE_RE = re.compile(r"^\s*(\d+)\s*[x×]\s*(\S.*?)\s*$", re.IGNORECASE)


class CatalogGPU(GPUSpec):
    """A catalog GPU: the contract's ``GPUSpec`` plus the catalog's own facts.

    The extra fields are not part of the plan contract; ``HardwareSpec`` serializes its
    ``gpu`` as a plain ``GPUSpec``.
    """

    id: str
    vendor: str
    gpu_to_gpu_gbs: float | None = None
    link: Literal["nvlink", "infinity_fabric", "pcie"] = "pcie"
    aliases: list[str] = Field(default_factory=list)
    # GPUs in one server of this part, the node shape a sizing counts whole nodes of
    # (knowledge/gpus.yaml conventions: 8 unless an entry says otherwise).
    node_gpus: int = Field(default=8, ge=1, le=16)


def _norm(text: str) -> str:
    """Case-, punctuation- and vendor-word-insensitive key for matching GPU names."""
    tokens = re.split(r"[^a-z0-9]+", text.lower())
    return "".join(t for t in tokens if t and t not in _VENDOR_WORDS)


@lru_cache(maxsize=1)
def load_gpu_catalog() -> dict[str, CatalogGPU]:
    """The GPU catalog from ``knowledge/gpus.yaml``, keyed by catalog id."""
    text = resources.files("knowledge").joinpath("gpus.yaml").read_text(encoding="utf-8")
    raw: dict[str, dict[str, Any]] = yaml.safe_load(text)
    return {gpu_id: CatalogGPU(id=gpu_id, **fields) for gpu_id, fields in raw.items()}


@lru_cache(maxsize=1)
def _gpu_index() -> dict[str, str]:
    """Normalized id, name and alias -> catalog id; a key claimed twice is a catalog bug."""
    index: dict[str, str] = {}
    for gpu_id, gpu in load_gpu_catalog().items():
        for key in {_norm(gpu_id), _norm(gpu.name), *(_norm(a) for a in gpu.aliases)}:
            if index.get(key, gpu_id) != gpu_id:
                raise RuntimeError(f"gpus.yaml: '{key}' names both {index[key]} and {gpu_id}")
            index[key] = gpu_id
    return index


def plannable_types() -> str:
    """The GPU catalog's types, one per family, for a refusal: ``V100, T4, A10G, ...``."""
    seen: dict[str, None] = {}
    for gpu_id in load_gpu_catalog():
        head = gpu_id.split("-")[0]
        seen[gpu_id if head.startswith("RTX") and "-" in gpu_id else head] = None
    return ", ".join(seen)


def find_gpu(name: str) -> CatalogGPU:
    """The catalog GPU named by an id or alias, ignoring case, punctuation and vendor words.

    Args:
        name: A catalog id ("A100-80GB"), an alias ("h100", "RTX 4090") or a device name as
            torch reports it ("NVIDIA A100-SXM4-80GB").

    Raises:
        InputError: On field ``hardware`` when no catalog GPU has that name.
    """
    catalog = load_gpu_catalog()
    gpu_id = _gpu_index().get(_norm(name))
    if gpu_id is not None:
        return catalog[gpu_id]
    by_lower = {key.lower(): key for key in catalog}
    for gpu in catalog.values():
        by_lower.update({alias.lower(): gpu.id for alias in gpu.aliases})
    close = difflib.get_close_matches(name.strip().lower(), list(by_lower), n=6, cutoff=0.6)
    suggestions = list(dict.fromkeys(by_lower[c] for c in close))
    hint = (
        f"close matches: {', '.join(suggestions[:3])}"
        if suggestions
        else f"known types include {', '.join(list(catalog)[:6])}, ..."
    )
    raise InputError("hardware", f"unknown GPU type {name.strip()!r}; {hint}")


def parse_hardware(spec: str, interconnect: str | None = None) -> HardwareSpec:
    """Resolve a hardware spec: ``local`` profiles this machine, NODESxGPUSxTYPE a cluster.

    Args:
        spec: ``local``, ``NODESxGPUSxTYPE`` (``2x8xH100-80GB``) or ``GPUSxTYPE`` for one node
            (``8xA100``). TYPE is a catalog id or alias (see ``knowledge/gpus.yaml``).
        interconnect: The network between nodes: ib400, ib200, roce100, eth25 or nvlink. When
            omitted, a single node reports its GPU link (nvlink, infinity_fabric or pcie) and a
            multi-node cluster reports None (unknown).

    Raises:
        InputError: On field ``hardware`` for a malformed spec, an unknown GPU type, a count out
            of range or an unknown interconnect.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InputError("hardware", f"empty hardware spec; {SPEC_EXAMPLE}")
    link = _check_interconnect(interconnect)
    if spec.strip().lower() == "local":
        local = profile_local()
        return local.model_copy(update={"interconnect": link}) if link else local

    match = _CLUSTER_RE.match(spec) or _SINGLE_NODE_RE.match(spec)
    if match is None:
        raise InputError("hardware", f"cannot read {spec.strip()!r}; {SPEC_EXAMPLE}")
    if len(match.groups()) == 3:
        nodes, gpus, type_name = int(match[1]), int(match[2]), match[3]
    else:
        nodes, gpus, type_name = 1, int(match[1]), match[2]
    if type_name.isdigit():
        raise InputError("hardware", f"{spec.strip()!r} names no GPU type; {SPEC_EXAMPLE}")
    if not 1 <= nodes <= MAX_NODES:
        raise InputError(
            "hardware", f"nodes must be 1..{MAX_NODES}, got {nodes} in {spec.strip()!r}"
        )
    if not 1 <= gpus <= MAX_GPUS_PER_NODE:
        raise InputError(
            "hardware",
            f"GPUs per node must be 1..{MAX_GPUS_PER_NODE}, got {gpus} in {spec.strip()!r}",
        )
    gpu = find_gpu(type_name)
    if link is None and nodes == 1:
        link = gpu.link
    return HardwareSpec(
        source="described",
        nodes=nodes,
        gpus_per_node=gpus,
        gpu=gpu,
        interconnect=link,
        # ROCm builds of torch expose AMD GPUs through the same torch.cuda API.
        cuda_available=True,
    )


def hardware_for_brief(brief: TrainingBrief) -> HardwareSpec:
    """The brief's hardware, with the node facts it states: host RAM and network cards.

    A described cluster's ``ram_gb`` is the brief's ``host_ram_gb`` (the memory plan's offload
    check reads it; otherwise it assumes a server sizing). ``local`` keeps what this machine
    reports. ``nics_per_node`` x ``nic_gbps`` is each node's network for the comm model.
    """
    hw = parse_hardware(brief.hardware, brief.interconnect)
    update: dict[str, Any] = {"nics_per_node": brief.nics_per_node, "nic_gbps": brief.nic_gbps}
    if hw.source == "described" and brief.host_ram_gb is not None:
        update["ram_gb"] = brief.host_ram_gb
    return hw.model_copy(update={k: v for k, v in update.items() if v is not None})


def _check_interconnect(interconnect: str | None) -> str | None:
    if interconnect is None or not interconnect.strip():
        return None
    value = interconnect.strip().lower()
    if value not in INTERCONNECTS:
        raise InputError(
            "hardware",
            f"unknown interconnect {interconnect.strip()!r}; use one of {', '.join(INTERCONNECTS)}",
        )
    return value


def _usable_cores() -> int:
    """Physical cores this process may use (the affinity mask wins inside containers)."""
    import psutil

    logical = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    physical = psutil.cpu_count(logical=False)
    counts = [n for n in (physical, logical) if n]
    return min(counts) if counts else (os.cpu_count() or 1)


def _local_gpu(
    name: str, memory_gb: float, source: str = "torch.cuda.get_device_properties"
) -> GPUSpec:
    """Catalog figures for a device this machine reports, or just its name and memory."""
    try:
        return find_gpu(name).model_copy(update={"name": name, "memory_gb": memory_gb})
    except InputError:
        pass
    # Device names carry suffixes the catalog lacks (OEM and vGPU variants); accept the longest
    # catalog key the name starts with, but only when the memory says it is the same part, so
    # an "H100 NVL" (94 GB) does not borrow the H100 SXM's figures.
    key = _norm(name)
    pcie = "pcie" in key
    best: CatalogGPU | None = None
    best_len = 0
    for alias_key, gpu_id in _gpu_index().items():
        gpu = load_gpu_catalog()[gpu_id]
        if not key.startswith(alias_key) or len(alias_key) <= best_len:
            continue
        if (pcie and gpu.link != "pcie") or abs(gpu.memory_gb - memory_gb) > 0.15 * gpu.memory_gb:
            continue
        best, best_len = gpu, len(alias_key)
    if best is not None:
        return best.model_copy(update={"name": name, "memory_gb": memory_gb})
    return GPUSpec(name=name, memory_gb=memory_gb, source=source)


def _torch_cuda() -> tuple[bool, int, tuple[str, float] | None]:
    """Whether torch sees CUDA (or ROCm), how many devices, and device 0's name and GiB."""
    if not gpu_probe.torch_may_see_gpus():
        return False, 0, None  # a CPU-only build: no need to import torch to know
    try:
        import torch  # lazy: heavy, and only profiling needs it here
    except ImportError:
        return False, 0, None
    if not torch.cuda.is_available():
        return False, 0, None
    count = torch.cuda.device_count()
    if not count:
        return True, 0, None
    props = torch.cuda.get_device_properties(0)
    return True, count, (props.name, round(props.total_memory / 2**30, 1))


# This machine's profile while ``local_profile_once`` is in force (None: probe every time).
_LOCAL_ONCE: dict[str, HardwareSpec] | None = None


def profile_local() -> HardwareSpec:
    """Profile this machine: CPU cores, RAM, and its GPUs as torch or the GPU driver sees them."""
    if _LOCAL_ONCE is None:
        return _local_hardware(gpu_probe.probe_gpus())
    if "local" not in _LOCAL_ONCE:
        _LOCAL_ONCE["local"] = _local_hardware(gpu_probe.probe_gpus())
    return _LOCAL_ONCE["local"]


@contextmanager
def local_profile_once() -> Iterator[None]:
    """Inside: this machine is probed once (nvidia-smi, torch) and its profile reused.

    For many estimates in one process (``estimate --batch``), where a probe per setup would
    start a driver tool per line; a long-lived process (the chat, the server) probes anew.
    """
    global _LOCAL_ONCE
    outer, _LOCAL_ONCE = _LOCAL_ONCE, {} if _LOCAL_ONCE is None else _LOCAL_ONCE
    try:
        yield
    finally:
        _LOCAL_ONCE = outer


def _local_hardware(probe: GPUProbe) -> HardwareSpec:
    """This machine's HardwareSpec: torch's view of the GPUs first, else the driver's."""
    import psutil

    cuda, count, device0 = _torch_cuda()
    gpu: GPUSpec | None = None
    if device0 is not None:
        gpu = _local_gpu(*device0)
    elif probe.gpus:
        # torch cannot use them (a CPU-only build, or no CUDA runtime), but the plan is for
        # this machine's GPUs, which a suitable install can use.
        count = len(probe.gpus)
        first = probe.gpus[0]
        gpu = _local_gpu(first.name, first.memory_gb, source=probe.source or "")
    return HardwareSpec(
        source="local",
        nodes=1,
        gpus_per_node=count,
        gpu=gpu,
        cpu_cores=_usable_cores(),
        ram_gb=round(psutil.virtual_memory().total / 2**30, 1),
        interconnect=_local_interconnect(count, probe.topology, gpu),
        cuda_available=cuda,
    )


def _local_interconnect(
    count: int, topology: GPUTopology | None, gpu: GPUSpec | None
) -> str | None:
    """The GPU link: "nvlink" when every pair of local GPUs has NVLink, else "pcie"; None without GPUs."""
    if count == 0:
        return None
    if topology is not None and topology.all_nvlink:
        # All pairs linked, so any subset torch was limited to (CUDA_VISIBLE_DEVICES) is too.
        return "nvlink"
    if count == 1 or (topology is not None and topology.gpu_count == count):
        return "pcie"
    # Several GPUs and no matrix that describes them (no nvidia-smi, or AMD): the part's
    # usual link from the catalog, as parse_hardware assumes for a described node.
    return gpu.link if isinstance(gpu, CatalogGPU) else None


PACKAGES = ("torch", "deepspeed", "transformers", "accelerate", "tensorflow", "horovod")
"""Libraries whose installed versions the profile reports (None when not installed)."""


def describe_local_machine(out_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The full local profile: the ``hardware`` contract part plus CPU, RAM, disk, GPUs, software.

    Args:
        out_dir: Where plans and smoke runs will write; its free disk is reported (the nearest
            existing parent when it does not exist yet). Defaults to the working directory.
    """
    import psutil

    probe = gpu_probe.probe_gpus()
    hardware = _local_hardware(probe)
    memory = psutil.virtual_memory()
    gpus = [_gpu_facts(device, probe.source or "") for device in probe.gpus]
    if not gpus and hardware.cuda_available:
        gpus = _torch_devices()  # the driver tools are missing but torch still sees devices
    topology = None
    if probe.topology is not None:
        topology = probe.topology.model_dump(mode="json") | {
            "all_nvlink": probe.topology.all_nvlink
        }
    return {
        "hardware": hardware.model_dump(mode="json"),
        "host": {
            "hostname": platform.node(),
            "os": platform.platform(),
            "python": platform.python_version(),
        },
        "cpu": {
            "model": cpu_model(),
            "arch": platform.machine() or None,
            "physical_cores": psutil.cpu_count(logical=False),
            "logical_cores": psutil.cpu_count(logical=True),
            "usable_cores": _usable_cores(),
        },
        "ram": {
            "total_gb": round(memory.total / 2**30, 1),
            "available_gb": round(memory.available / 2**30, 1),
        },
        "disk": _disk(Path(out_dir) if out_dir is not None else Path.cwd()),
        "gpus": gpus,
        "gpu_driver": {
            "source": probe.source if probe.gpus else ("torch" if gpus else None),
            "driver_version": probe.driver_version,
            "cuda_version": probe.cuda_version,
        },
        "gpu_summary": probe.summary()
        if probe.gpus or not gpus
        else f"{len(gpus)} GPU(s) via torch",
        "topology": topology,
        "software": _software(),
        "notes": probe.notes,
    }


def _gpu_facts(device: GPUDevice, source: str) -> dict[str, Any]:
    spec = _local_gpu(device.name, device.memory_gb, source=source)
    return device.model_dump(mode="json") | {
        "catalog_id": spec.id if isinstance(spec, CatalogGPU) else None,
        "bf16_tflops": spec.bf16_tflops,
    }


def _disk(path: Path) -> dict[str, Any]:
    """Free and total GiB on the filesystem that holds ``path`` (or its nearest existing parent)."""
    target = path.absolute()
    while not target.exists() and target != target.parent:
        target = target.parent
    try:
        usage = shutil.disk_usage(target)
    except OSError:
        return {"path": str(path.absolute()), "free_gb": None, "total_gb": None}
    return {
        "path": str(path.absolute()),
        "free_gb": round(usage.free / 2**30, 1),
        "total_gb": round(usage.total / 2**30, 1),
    }


def _software() -> dict[str, Any]:
    """Installed library versions, and what torch's build can use."""
    facts: dict[str, Any] = {name: package_version(name) for name in PACKAGES}
    facts.update(torch_cuda_available=False, torch_cuda_build=None, torch_hip_build=None)
    if facts["torch"] is None:
        return facts
    try:
        import torch
    except ImportError:
        return facts
    facts["torch_cuda_available"] = bool(torch.cuda.is_available())
    facts["torch_cuda_build"] = getattr(torch.version, "cuda", None)
    facts["torch_hip_build"] = getattr(torch.version, "hip", None)
    return facts


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (x86 "model name", ARM "Hardware"), if known."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                # x86 says "model name"; some ARM kernels only say "Hardware".
                if line.lower().startswith(("model name", "hardware")):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def package_version(package: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _torch_devices() -> list[dict[str, Any]]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        spec = _local_gpu(props.name, round(props.total_memory / 2**30, 1))
        devices.append(
            {
                "index": index,
                "name": props.name,
                "vendor": "amd" if getattr(torch.version, "hip", None) else "nvidia",
                "memory_gb": spec.memory_gb,
                "compute_capability": f"{props.major}.{props.minor}",
                "catalog_id": spec.id if isinstance(spec, CatalogGPU) else None,
                "bf16_tflops": spec.bf16_tflops,
            }
        )
    return devices
