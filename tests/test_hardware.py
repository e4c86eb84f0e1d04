"""Hardware specs, the GPU catalog and local profiling."""

from __future__ import annotations

import pytest

from tools.errors import InputError
from tools.hardware import (
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

    if torch.cuda.is_available():
        assert hw.gpus_per_node == torch.cuda.device_count() and hw.gpu is not None
    else:
        assert (hw.gpus_per_node, hw.gpu, hw.cuda_available, hw.world_size) == (0, None, False, 1)
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


def test_describe_local_machine_reports_versions_and_tolerates_missing_packages() -> None:
    facts = describe_local_machine()
    assert facts["logical_cores"] >= 1 and facts["ram_gb"] > 0
    assert facts["packages"]["torch"] and facts["packages"]["transformers"]
    assert "tensorflow" in facts["packages"]  # None when not installed, never an exception
    assert isinstance(facts["gpus"], list)
