"""Hardware specs, the GPU catalog and local profiling."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tools.artifacts.text import profile_text as format_profile
from tools.core.errors import InputError
from tools.research import gpu_probe
from tools.research.gpu_probe import (
    ROCM_SMI,
    SMI_HEADER,
    SMI_QUERY,
    SMI_QUERY_OLD,
    SMI_TOPO,
    CommandFailed,
    ProbeError,
    parse_topology,
    probe_gpus,
    run_command,
)
from tools.research.hardware import (
    describe_local_machine,
    find_gpu,
    load_gpu_catalog,
    parse_hardware,
    profile_local,
)

REQUIRED_GPUS = {
    "V100-16GB", "V100-32GB", "T4", "A10G", "L4", "L40S", "A100-40GB", "A100-40GB-PCIE",
    "A100-80GB", "A100-80GB-PCIE", "H100-80GB", "H100-PCIE", "H200", "B200", "RTX3090",
    "RTX4090", "MI250X", "MI300X",
}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "nodes", "gpus", "world", "gpu_id"),
    [
        ("1x8xA100-80GB", 1, 8, 8, "A100-80GB"),
        ("2x8xH100-80GB", 2, 8, 16, "H100-80GB"),
        ("8xA100", 1, 8, 8, "A100-80GB"),
        ("1x1xRTX4090", 1, 1, 1, "RTX4090"),
        ("4X8Xmi300x", 4, 8, 32, "MI300X"),  # the type's own "x" is not a separator
        (" 2 x 4 x A100 80GB PCIe ", 2, 4, 8, "A100-80GB-PCIE"),
    ],
)
def test_cluster_specs(spec: str, nodes: int, gpus: int, world: int, gpu_id: str) -> None:
    hw = parse_hardware(spec)
    assert (hw.source, hw.nodes, hw.gpus_per_node) == ("described", nodes, gpus)
    assert hw.world_size == world
    assert hw.gpu == load_gpu_catalog()[gpu_id]
    assert hw.cpu_cores is None and hw.ram_gb is None


def test_interconnect_defaults_and_choices() -> None:
    assert parse_hardware("1x8xH100-80GB").interconnect == "nvlink"
    assert parse_hardware("1x8xH100-PCIE").interconnect == "pcie"
    assert parse_hardware("1x4xRTX4090").interconnect == "pcie"
    # Between nodes nothing can be assumed; the user says what the network is.
    assert parse_hardware("2x8xH100-80GB").interconnect is None
    assert parse_hardware("2x8xH100-80GB", "IB400").interconnect == "ib400"
    with pytest.raises(InputError) as err:
        parse_hardware("2x8xH100-80GB", "carrier-pigeon")
    assert err.value.field == "hardware" and "ib400" in err.value.message


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("9xbanana", "unknown GPU type 'banana'"),
        ("0x8xA100", "nodes must be 1..4096"),
        ("5000x8xA100", "nodes must be 1..4096"),
        ("1x0xA100", "GPUs per node must be 1..16"),
        ("1x17xA100", "GPUs per node must be 1..16"),
        ("axbxc", "1x8xA100-80GB"),  # malformed: show the expected format
        ("2x8", "names no GPU type"),
        ("", "1x8xA100-80GB"),
        ("1x8xH100-80G", "close matches: H100-80GB"),
    ],
)
def test_bad_specs_name_the_field_in_one_line(spec: str, expected: str) -> None:
    with pytest.raises(InputError) as err:
        parse_hardware(spec)
    assert err.value.field == "hardware"
    assert expected in err.value.message
    assert "\n" not in str(err.value)


def test_find_gpu_ignores_case_punctuation_and_vendor_words() -> None:
    assert find_gpu("h100").id == "H100-80GB"
    assert find_gpu("H100_SXM").id == "H100-80GB"
    assert find_gpu("rtx 4090").id == find_gpu("4090").id == "RTX4090"
    assert find_gpu("NVIDIA GeForce RTX 4090").id == "RTX4090"
    assert find_gpu("NVIDIA A100-SXM4-40GB").id == "A100-40GB"
    assert find_gpu("Tesla T4").id == "T4"
    # The catalog's display names round-trip, so a plan's hardware.gpu.name finds its entry.
    for gpu_id, gpu in load_gpu_catalog().items():
        assert find_gpu(gpu.name).id == gpu_id


def test_unknown_gpu_with_nothing_close_lists_known_types() -> None:
    with pytest.raises(InputError, match="known types include V100-16GB"):
        find_gpu("zzzzzz")


def test_catalog_covers_the_parts_and_uses_dense_figures() -> None:
    catalog = load_gpu_catalog()
    assert REQUIRED_GPUS <= set(catalog)
    for gpu in catalog.values():
        assert gpu.memory_gb > 0 and gpu.memory_bandwidth_gbs and gpu.source
        assert gpu.fp16_tflops and gpu.gpu_to_gpu_gbs and gpu.vendor in {"nvidia", "amd"}
    # Dense, not the 2:4-sparsity headline: A100 312 (not 624), H100 SXM 989 (not 1979).
    assert catalog["A100-80GB"].bf16_tflops == 312
    assert catalog["A100-80GB"].memory_bandwidth_gbs == 2039
    assert catalog["H100-80GB"].bf16_tflops == pytest.approx(989, abs=1)
    assert catalog["H100-80GB"].memory_bandwidth_gbs == 3350
    assert catalog["RTX4090"].bf16_tflops == pytest.approx(165.2)
    assert catalog["V100-32GB"].bf16_tflops is None  # no bf16 before Ampere


def test_profile_local_on_this_machine() -> None:
    hw = profile_local()
    assert hw.source == "local" and hw.nodes == 1
    assert hw.cpu_cores is not None and hw.cpu_cores >= 1
    assert hw.ram_gb is not None and hw.ram_gb > 0
    import torch

    driver_gpus = gpu_probe.probe_gpus().gpus
    if torch.cuda.is_available():
        assert hw.gpus_per_node == torch.cuda.device_count() and hw.gpu is not None
    elif driver_gpus:  # a CPU-only torch on a GPU machine: the plan is still for its GPUs
        assert (hw.gpus_per_node, hw.cuda_available) == (len(driver_gpus), False)
    else:
        assert (hw.gpus_per_node, hw.gpu, hw.cuda_available, hw.world_size) == (0, None, False, 1)
        assert hw.interconnect is None
    assert parse_hardware("local") == hw


def test_profile_local_matches_a_visible_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    class Props:
        name = "NVIDIA A100-SXM4-80GB"
        total_memory = 81920 * 2**20

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props)
    hw = profile_local()
    assert (hw.gpus_per_node, hw.cuda_available) == (4, True)
    assert hw.gpu is not None and hw.gpu.name == Props.name
    assert (hw.gpu.memory_gb, hw.gpu.bf16_tflops) == (80.0, 312)

    Props.name = "NVIDIA Imaginary X9"
    hw = profile_local()
    assert hw.gpu is not None and hw.gpu.bf16_tflops is None and hw.gpu.memory_gb == 80.0

    # A suffixed name still matches when the memory agrees, and not when it does not.
    Props.name, Props.total_memory = "NVIDIA L4 vGPU", 22 * 2**30
    assert (gpu := profile_local().gpu) is not None and gpu.bf16_tflops == 121
    Props.name, Props.total_memory = "NVIDIA H100 NVL", 94 * 2**30
    assert (gpu := profile_local().gpu) is not None and gpu.bf16_tflops is None


def test_describe_local_machine_reports_versions_and_tolerates_missing_packages(
    tmp_path: Path,
) -> None:
    facts = describe_local_machine(tmp_path / "not-yet" / "out")
    assert facts["hardware"] == profile_local().model_dump(mode="json")
    assert facts["cpu"]["logical_cores"] >= 1 and facts["ram"]["total_gb"] > 0
    assert facts["cpu"]["model"]
    # The output directory need not exist yet: its nearest existing parent's disk is reported.
    assert facts["disk"]["free_gb"] > 0 and facts["disk"]["path"].endswith("out")
    software = facts["software"]
    assert software["torch"] and software["transformers"]
    assert "tensorflow" in software  # None when not installed, never an exception
    import torch

    assert software["torch_cuda_available"] == torch.cuda.is_available()
    if not facts["gpus"]:
        assert facts["gpu_summary"].startswith("no GPU found")
        assert "gpus: no GPU found" in format_profile(facts)


# ---- the GPU probe, on recorded driver-tool outputs ----------------------------------------

GPU_DATA = Path(__file__).parents[1] / "data" / "gpu"


def recorded(machine: str, *, skip: tuple[str, ...] = ()) -> Callable[[Sequence[str]], str]:
    """A command runner that answers from tests/data/gpu/<machine>_*; other tools are missing."""
    files = {
        tuple(SMI_QUERY): f"{machine}_query.csv",
        tuple(SMI_HEADER): f"{machine}_nvidia-smi.txt",
        tuple(SMI_TOPO): f"{machine}_topo.txt",
        tuple(ROCM_SMI): f"{machine}_rocm-smi.json",
    }

    def run(argv: Sequence[str]) -> str:
        calls.append(list(argv))
        name = files.get(tuple(argv))
        if name is None or name in skip or not (GPU_DATA / name).is_file():
            raise ProbeError(f"{argv[0]}: not installed")
        return (GPU_DATA / name).read_text(encoding="utf-8")

    calls: list[list[str]] = []
    run.calls = calls  # type: ignore[attr-defined]
    return run


class FakeNVML:
    """The slice of pynvml the probe uses, answering from a recorded tests/data/gpu/*_nvml.json."""

    class NVMLError(Exception):
        pass

    def __init__(self, machine: str | None) -> None:
        self.data = json.loads((GPU_DATA / f"{machine}_nvml.json").read_text()) if machine else None
        self.shutdown = False

    def nvmlInit(self) -> None:
        if self.data is None:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdown = True

    def nvmlDeviceGetCount(self) -> int:
        assert self.data is not None
        return len(self.data["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        assert self.data is not None
        return dict(self.data["devices"][index])

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> bytes:
        return str(handle["nvmlDeviceGetName"]).encode()  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(total=handle["nvmlDeviceGetMemoryInfo.total"], free=0, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: dict[str, Any]) -> tuple[int, int]:
        major, minor = handle["nvmlDeviceGetCudaComputeCapability"]
        return major, minor

    def nvmlSystemGetDriverVersion(self) -> str:
        assert self.data is not None
        return str(self.data["nvmlSystemGetDriverVersion"])

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        assert self.data is not None
        return int(self.data["nvmlSystemGetCudaDriverVersion"])


MACHINES = {
    # machine: (count, name, GiB, compute capability, driver, CUDA)
    "h100x8": (8, "NVIDIA H100 80GB HBM3", 79.6, "9.0", "550.54.15", "12.4"),
    "rtx4090": (1, "NVIDIA GeForce RTX 4090", 24.0, "8.9", "550.67", "12.4"),
}


@pytest.mark.parametrize("machine", sorted(MACHINES))
@pytest.mark.parametrize("via", ["nvml", "nvidia-smi"])
def test_probe_reads_gpu_facts_from_nvml_or_nvidia_smi(machine: str, via: str) -> None:
    run = recorded(machine)
    nvml = FakeNVML(machine) if via == "nvml" else None
    probe = probe_gpus(run=run, nvml=nvml)
    count, name, memory_gb, capability, driver, cuda = MACHINES[machine]
    assert probe.source == via
    assert [g.index for g in probe.gpus] == list(range(count))
    assert {(g.name, g.vendor, g.memory_gb, g.compute_capability) for g in probe.gpus} == {
        (name, "nvidia", memory_gb, capability)
    }
    assert (probe.driver_version, probe.cuda_version) == (driver, cuda)
    assert probe.summary() == f"{count}x {name} (via {via})"
    if via == "nvml":
        # NVML answered, so nvidia-smi is asked only for the topology matrix.
        assert run.calls == [SMI_TOPO]  # type: ignore[attr-defined]
        assert nvml is not None and nvml.shutdown
    else:
        assert probe.notes == ["NVML: nvidia-ml-py not installed"]


def test_h100_node_is_all_nvlink_with_18_links_and_the_4090_has_no_links() -> None:
    topo = probe_gpus(run=recorded("h100x8"), nvml=FakeNVML("h100x8")).topology
    assert topo is not None and topo.gpu_count == 8 and topo.all_nvlink
    assert len(topo.links) == 28  # every pair of 8 GPUs; NIC rows and columns are not GPUs
    assert {(link.kind, link.nvlinks, link.path) for link in topo.links} == {("nvlink", 18, "NV18")}

    topo = probe_gpus(run=recorded("rtx4090"), nvml=FakeNVML("rtx4090")).topology
    assert topo is not None and topo.gpu_count == 1
    assert topo.links == [] and not topo.all_nvlink


def test_topology_paths_other_than_nvlink_are_pcie() -> None:
    # A 4-GPU workstation with two NVLink bridges: pairs 0-1 and 2-3 only.
    text = (
        "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV4\tPXB\tSYS\t0-15\t0\t\tN/A\n"
        "GPU1\tNV4\t X \tPHB\tSYS\t0-15\t0\t\tN/A\n"
        "GPU2\tPXB\tPHB\t X \tNV4\t16-31\t1\t\tN/A\n"
        "GPU3\tSYS\tSYS\tNV4\t X \t16-31\t1\t\tN/A\n"
    )
    topo = parse_topology(text)
    assert topo is not None and not topo.all_nvlink
    kinds = {link.gpus: (link.kind, link.nvlinks, link.path) for link in topo.links}
    assert kinds == {
        (0, 1): ("nvlink", 4, "NV4"),
        (0, 2): ("pcie", 0, "PXB"),
        (0, 3): ("pcie", 0, "SYS"),
        (1, 2): ("pcie", 0, "PHB"),
        (1, 3): ("pcie", 0, "SYS"),
        (2, 3): ("nvlink", 4, "NV4"),
    }
    assert parse_topology("No devices were found\n") is None


def test_no_gpu_no_nvml_no_tools_reports_no_gpu_and_why() -> None:
    def nothing(argv: Sequence[str]) -> str:
        raise ProbeError(f"{argv[0]}: not installed")

    probe = probe_gpus(run=nothing, nvml=FakeNVML(None))
    assert (probe.gpus, probe.source, probe.topology) == ([], None, None)
    assert probe.notes == [
        "NVML: NVML Shared Library Not Found",
        "nvidia-smi: not installed",
        "rocm-smi: not installed",
    ]
    assert probe.summary().startswith("no GPU found (NVML: NVML Shared Library Not Found;")


def test_an_old_driver_without_compute_cap_still_reports_its_gpus() -> None:
    def old_driver(argv: Sequence[str]) -> str:
        if list(argv) == SMI_QUERY:
            raise CommandFailed('nvidia-smi: exit 2: Field "compute_cap" is not a valid field')
        if list(argv) == SMI_QUERY_OLD:
            return "Tesla V100-SXM2-32GB, 32510, 470.82.01\n" * 2
        if list(argv) == SMI_HEADER:
            return (
                "| NVIDIA-SMI 470.82.01    Driver Version: 470.82.01    CUDA Version: 11.4     |\n"
            )
        raise ProbeError(f"{argv[0]}: not installed")

    probe = probe_gpus(run=old_driver, nvml=None)
    assert [(g.name, g.memory_gb, g.compute_capability) for g in probe.gpus] == [
        ("Tesla V100-SXM2-32GB", 31.7, None)
    ] * 2
    assert (probe.driver_version, probe.cuda_version) == ("470.82.01", "11.4")
    assert probe.topology is None and probe.notes[-1] == "topology: nvidia-smi: not installed"


def test_amd_gpus_come_from_rocm_smi() -> None:
    probe = probe_gpus(run=recorded("mi300x8"), nvml=None)
    assert probe.source == "rocm-smi" and len(probe.gpus) == 8
    assert {(g.name, g.vendor, g.memory_gb, g.compute_capability) for g in probe.gpus} == {
        ("AMD Instinct MI300X OAM", "amd", 191.7, "gfx942")
    }
    assert probe.driver_version == "6.7.0"


def test_run_command_handles_missing_failing_and_slow_binaries() -> None:
    assert run_command([sys.executable, "-c", "print('hi')"]).strip() == "hi"
    with pytest.raises(ProbeError, match="not installed"):
        run_command(["trainwright-no-such-binary", "--version"])
    with pytest.raises(CommandFailed, match="exit 3: broken"):
        run_command([sys.executable, "-c", "import sys; print('broken'); sys.exit(3)"])
    with pytest.raises(ProbeError, match="no answer within 0.5 s"):
        run_command([sys.executable, "-c", "import time; time.sleep(10)"], timeout_s=0.5)


# ---- the local profile built on the probe -------------------------------------------------


def _use_probe(monkeypatch: pytest.MonkeyPatch, machine: str, nvml: bool = True) -> None:
    fake = FakeNVML(machine) if nvml else None
    monkeypatch.setattr(
        gpu_probe, "probe_gpus", lambda: probe_gpus(run=recorded(machine), nvml=fake)
    )


@pytest.mark.parametrize(
    ("machine", "count", "gpu_id", "bf16_tflops", "interconnect"),
    [
        ("h100x8", 8, "H100-80GB", 989.4, "nvlink"),
        ("rtx4090", 1, "RTX4090", 165.2, "pcie"),
        # No topology from rocm-smi: the catalog's usual link for the part.
        ("mi300x8", 8, "MI300X", 1307.4, "infinity_fabric"),
    ],
)
def test_profile_local_uses_the_driver_when_torch_sees_no_gpu(
    monkeypatch: pytest.MonkeyPatch,
    machine: str,
    count: int,
    gpu_id: str,
    bf16_tflops: float,
    interconnect: str,
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _use_probe(monkeypatch, machine, nvml=machine != "mi300x8")
    hw = profile_local()
    assert (hw.source, hw.nodes, hw.gpus_per_node) == ("local", 1, count)
    assert hw.cuda_available is False  # torch's own answer: this build cannot use them
    assert hw.gpu is not None and hw.gpu.bf16_tflops == bf16_tflops
    catalog = load_gpu_catalog()[gpu_id]
    assert (hw.gpu.fp32_tflops, hw.gpu.memory_bandwidth_gbs) == (
        catalog.fp32_tflops,
        catalog.memory_bandwidth_gbs,
    )
    assert hw.interconnect == interconnect
    assert parse_hardware("local") == hw
    assert parse_hardware("local", "ib400").interconnect == "ib400"


def test_profile_local_takes_the_topology_when_torch_sees_the_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    class Props:
        name = "NVIDIA H100 80GB HBM3"
        total_memory = 81559 * 2**20

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # CUDA_VISIBLE_DEVICES=0,1
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props)
    _use_probe(monkeypatch, "h100x8")
    hw = profile_local()
    assert (hw.gpus_per_node, hw.cuda_available, hw.interconnect) == (2, True, "nvlink")
    assert hw.gpu is not None and hw.gpu.bf16_tflops == pytest.approx(989.4)


def test_describe_local_machine_on_a_recorded_h100_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _use_probe(monkeypatch, "h100x8")
    facts = describe_local_machine(tmp_path)
    assert facts["hardware"]["gpus_per_node"] == 8
    assert facts["hardware"]["gpu"]["bf16_tflops"] == pytest.approx(989.4)
    assert facts["hardware"]["interconnect"] == "nvlink"
    assert len(facts["gpus"]) == 8
    assert facts["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "vendor": "nvidia",
        "memory_gb": 79.6,
        "compute_capability": "9.0",
        "catalog_id": "H100-80GB",
        "bf16_tflops": pytest.approx(989.4),
    }
    assert facts["gpu_driver"] == {
        "source": "nvml",
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
    }
    assert facts["topology"]["all_nvlink"] and len(facts["topology"]["links"]) == 28
    json.dumps(facts)  # the CLI writes it as JSON
    summary = format_profile(facts)
    assert "gpus: 8x NVIDIA H100 80GB HBM3 (via nvml)" in summary
    assert "compute 9.0 (catalog H100-80GB, 989.4 bf16 TFLOP/s)" in summary
    assert "driver: 550.54.15, CUDA 12.4" in summary
    assert "topology: all 8 GPUs NVLink-connected (NV18)" in summary
    assert "interconnect nvlink" in summary
