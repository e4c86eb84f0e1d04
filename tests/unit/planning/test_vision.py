"""Image models: FLOPs from layer shapes, images/s against published runs, feature-map memory."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tools.intake.brief import image_seq_len
from tools.planning import estimate_speed, training_flops_per_token
from tools.planning.activations import activation_bytes
from tools.planning.kernels import KERNEL_FACTS, kernel_class
from tools.planning.vision import conv_net_of
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import load_model_catalog, lookup_model

PUBLISHED = Path(__file__).resolve().parents[3] / "bench" / "calibration" / "vision_published.tsv"


def _image_model(name: str):
    spec = lookup_model(name, 1)
    seq = image_seq_len(spec.name, spec.params, spec.hf_config or {})
    assert seq is not None, name
    return lookup_model(name, seq), seq


def _forward_macs(name: str) -> float:
    """Forward multiply-accumulates per image, from the speed model's FLOPs per position."""
    model, seq = _image_model(name)
    return training_flops_per_token(model, seq, activation_checkpointing=False) * seq / 3 / 2


def test_resnet50_forward_is_4_1_gmacs_from_its_layer_shapes():
    # torchvision ResNet50_Weights.IMAGENET1K_V2: 4.09 GFLOPS (multiply-adds) at 224x224, the
    # figure the catalog cites; counted here from the convolutions' shapes, not read from it.
    net = conv_net_of(lookup_model("resnet-50", 160))
    assert net is not None
    assert net.forward_macs == pytest.approx(4.09e9, rel=0.005)
    assert _forward_macs("resnet-50") == pytest.approx(4.09e9, rel=0.005)


def test_every_catalog_convnet_matches_its_published_forward_macs():
    catalog = load_model_catalog()
    checked = 0
    for name, entry in catalog.items():
        if "forward_macs" not in entry:
            continue
        net = conv_net_of(lookup_model(name, 1))
        assert net is not None, name
        assert net.forward_macs == pytest.approx(float(entry["forward_macs"]), rel=0.02), name
        checked += 1
    assert checked >= 4  # ResNet-50/101, ConvNeXt-T/B


def test_vit_b16_forward_is_17_6_gmacs_over_197_positions():
    # Touvron et al. 2021 (DeiT), Table 1: ViT-B/16 (DeiT-B) at 224: 17.6 GFLOPs (multiply-adds),
    # 196 patches + the class token.
    model, seq = _image_model("vit-base")
    assert seq == 197
    assert _forward_macs("vit-base") == pytest.approx(17.6e9, rel=0.02)


def _published_rows():
    lines = [ln for ln in PUBLISHED.read_text().splitlines() if not ln.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t"))


def _predicted_per_gpu(row: dict[str, str]) -> float:
    model, seq = _image_model(row["model"])
    n = int(row["n_gpus"])
    est = estimate_speed(
        model,
        parse_hardware(f"1x{n}x{row['gpu']}"),
        "ddp",
        micro_batch_size=int(row["batch_per_gpu"]),
        gradient_accumulation_steps=1,
        precision="fp16",
        seq_len=seq,
    )
    assert est.images_per_s is not None
    return est.images_per_s / n


def test_resnet50_amp_images_per_s_within_15pct_of_nvidia_published_v100_and_a100():
    # NVIDIA DeepLearningExamples ResNet-50 v1.5 (TensorFlow and PyTorch), one GPU, AMP:
    # bench/calibration/vision_published.tsv, with the README, commit and table of each row.
    rows = [
        r
        for r in _published_rows()
        if r["model"] == "resnet-50"
        and r["precision"] == "amp"
        and r["n_gpus"] == "1"
        and r["source"].startswith("NVIDIA/")
    ]
    assert {r["gpu"][:4] for r in rows} == {"V100", "A100"}
    for row in rows:
        measured = float(row["images_per_s_total"])
        assert _predicted_per_gpu(row) == pytest.approx(measured, rel=0.15), row["row_id"]


def test_resnet50_v100_amp_is_in_the_issue_band_and_mfu_stays_under_the_gemm_plateau():
    model, seq = _image_model("resnet-50")
    hw = parse_hardware("1x8xV100-16GB")
    est = estimate_speed(
        model, hw, "ddp", micro_batch_size=256, gradient_accumulation_steps=1,
        precision="fp16", seq_len=seq,
    )  # fmt: skip
    per_gpu = est.images_per_s / 8
    assert 1000 <= per_gpu <= 1300  # issue 30: "a V100 with AMP does roughly 1,000-1,300"
    assert est.mfu <= KERNEL_FACTS[kernel_class(hw.gpu)].gemm
    assert any(a.startswith("input pipeline (assumed") for a in est.assumptions)
    assert est.tokens_per_s == pytest.approx(est.images_per_s * seq)


def test_the_host_input_pipeline_is_a_stated_ceiling_when_the_cores_are_known():
    model, seq = _image_model("resnet-50")
    hw = parse_hardware("1x8xV100-16GB").model_copy(update={"cpu_cores": 8})
    est = estimate_speed(
        model, hw, "ddp", micro_batch_size=128, gradient_accumulation_steps=1,
        precision="fp16", seq_len=seq,
    )  # fmt: skip
    assert est.input_images_per_s is not None and est.input_images_per_s < est.images_per_s
    note = next(a for a in est.assumptions if a.startswith("input pipeline"))
    assert "the input pipeline is the ceiling" in note and "DALI" in note


def test_a_language_model_has_no_images_per_s():
    est = estimate_speed(
        lookup_model("gpt2", 1024), parse_hardware("1x1xA100-80GB"), "ddp",
        micro_batch_size=4, gradient_accumulation_steps=1, seq_len=1024,
    )  # fmt: skip
    assert est.images_per_s is None and est.input_images_per_s is None


def test_small_channel_layers_run_below_the_gemm_plateau():
    # The stem and the 64-channel stage hold the short reductions: ResNet-50's executed
    # FLOPs run well below the large-GEMM efficiency, ViT-B's closer to it.
    hw = parse_hardware("1x1xA100-80GB")
    plateau = KERNEL_FACTS[kernel_class(hw.gpu)].gemm
    for name, most in (("resnet-50", 0.5), ("vit-base", 1.0)):
        model, seq = _image_model(name)
        est = estimate_speed(
            model, hw, "ddp", micro_batch_size=128, gradient_accumulation_steps=1,
            seq_len=seq,
        )  # fmt: skip
        assert est.efficiency is not None and est.efficiency <= most * plateau, name


def test_convnet_activation_memory_is_its_feature_maps():
    # ResNet-50: 26.5 M feature-map elements per 224x224 image kept for backward (2 bytes).
    model, seq = _image_model("resnet-50")
    net = conv_net_of(model)
    assert net is not None
    per_image = sum(layer.elements for layer in net.elementwise)
    assert per_image == pytest.approx(26.5e6, rel=0.01)
    acts = activation_bytes(
        model, seq_len=seq, micro_batch_size=256, precision="bf16",
        activation_checkpointing=False,
    )  # fmt: skip
    assert acts == 256 * per_image * 2
    full = activation_bytes(
        model, seq_len=seq, micro_batch_size=256, precision="bf16",
        activation_checkpointing=True,
    )  # fmt: skip
    assert full < acts / 2


def test_estimate_json_gains_images_per_s_and_the_text_says_it(tmp_path: Path, cli_main) -> None:
    out = tmp_path / "e.json"
    res = cli_main(
        "estimate", "--model", "resnet-50", "--hardware", "1x8xV100-16GB", "--precision",
        "fp16", "--global-batch", "2048", "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    setup = data["setup"]
    assert "images_per_s" not in setup  # the candidates keep the contract's keys
    assert data["images_per_s"] * 160 == pytest.approx(setup["tokens_per_s"])
    assert 900 <= data["images_per_s"] / 8 <= 1300
    assert "images/s:" in res.stdout and "input pipeline (assumed" in res.stdout
    assert "seq 160" in res.stdout  # one image, not the planner's default sequence


def test_estimate_precision_tf32_says_its_peak_and_layout_and_refuses_a_v100(
    tmp_path: Path, cli_main
) -> None:
    out = tmp_path / "e.json"
    res = cli_main(
        "estimate", "--model", "resnet-50", "--hardware", "1x1xA100-80GB", "--precision",
        "tf32", "--global-batch", "256", "--json", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "tf32: fp32 tensors, matmuls and convolutions on TF32 tensor cores at 156" in res.stdout
    assert "memory format NHWC (channels-last) assumed" in res.stdout
    assumptions = json.loads(out.read_text())["assumptions"]
    assert any(a.startswith("memory format NHWC") for a in assumptions)
    res = cli_main(
        "estimate", "--model", "resnet-50", "--hardware", "1x1xV100-16GB", "--precision",
        "tf32", "--global-batch", "256", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "no TF32 peak" in res.stderr
