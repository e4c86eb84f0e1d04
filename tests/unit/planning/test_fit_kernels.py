"""bench/calibration/fit_kernels.py recovers kernel fractions planted in made-up measurements."""

from __future__ import annotations

import dataclasses

import pytest

from bench.calibration import fit_kernels
from bench.calibration.published import Case
from tools.planning import kernels
from tools.planning.speed import estimate_speed
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import lookup_model


def _cases(gemm: float, attention: float) -> list[Case]:
    """Measurements the speed model itself makes with A100 fractions set to ``gemm``/``attention``."""
    original = kernels.KERNEL_FACTS["a100"]
    planted = dataclasses.replace(
        original, gemm=gemm, attention_fwd=attention, attention_bwd=round(attention * 0.8, 3)
    )
    cases = []
    try:
        kernels.KERNEL_FACTS["a100"] = planted
        kernels.clear_caches()
        for i, (name, seq, micro) in enumerate(
            [("gpt2-medium", 1024, 8), ("llama-3-8b", 8192, 1), ("llama-3-8b", 2048, 4),
             ("gpt2-xl", 1024, 4), ("llama-3-8b", 32768, 1)]
        ):  # fmt: skip
            model = lookup_model(name, seq)
            hw = parse_hardware("1x8xA100-80GB")
            setup = {"strategy": "zero3", "micro_batch_size": micro,
                     "gradient_accumulation_steps": 1, "seq_len": seq, "recompute": "full"}  # fmt: skip
            kwargs = {k: v for k, v in setup.items() if k != "strategy"}
            measured = estimate_speed(model, hw, "zero3", **kwargs).tokens_per_s / 8
            cases.append(
                Case(f"X{i}", "made-up", "fit", model, hw, setup, measured, "planted", ("g",))
            )
    finally:
        kernels.KERNEL_FACTS["a100"] = original
        kernels.clear_caches()
    return cases


def test_the_fit_recovers_planted_fractions_and_restores_the_table() -> None:
    before = kernels.KERNEL_FACTS["a100"]
    found = fit_kernels.fit(_cases(gemm=0.625, attention=0.45))
    assert found["a100"]["gemm"] == pytest.approx(0.625)
    assert found["a100"]["attention_fwd"] == pytest.approx(0.45)
    assert found["a100"]["mean_abs_log_error"] < 1e-6
    assert kernels.KERNEL_FACTS["a100"] == before  # the search leaves the code's values


def test_the_fp8_fit_recovers_a_planted_gemm_share_and_restores_the_table() -> None:
    from tools.planning import fp8

    before = dict(fp8.FP8_GEMM)
    hw = parse_hardware("1x8xH100-80GB")
    cases = []
    try:
        fp8.FP8_GEMM["h100"] = 0.55
        kernels.clear_caches()
        for i, (name, seq, micro) in enumerate([("llama-3-8b", 8192, 1), ("gpt2-xl", 1024, 4)]):
            model = lookup_model(name, seq)
            setup = {"strategy": "zero3", "micro_batch_size": micro, "precision": "fp8",
                     "gradient_accumulation_steps": 1, "seq_len": seq, "recompute": "full"}  # fmt: skip
            kwargs = {k: v for k, v in setup.items() if k != "strategy"}
            measured = estimate_speed(model, hw, "zero3", **kwargs).tokens_per_s / 8
            cases.append(Case(f"Y{i}", "made-up", "fit", model, hw, setup, measured, "p", ("g",)))
    finally:
        fp8.FP8_GEMM.clear()
        fp8.FP8_GEMM.update(before)
        kernels.clear_caches()
    found = fit_kernels.fit_fp8(cases)
    assert found["h100"]["fp8_gemm"] == pytest.approx(0.55)
    assert found["h100"]["mean_abs_log_error"] < 1e-6
    assert fp8.FP8_GEMM == before
