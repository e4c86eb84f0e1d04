"""``estimate --precision fp8`` in process: fp8 linears priced and said, or refused by GPU name."""

from __future__ import annotations

import json
from pathlib import Path

ARGS = ("estimate", "--model", "llama-3-8b", "--seq-len", "8192", "--global-batch", "64",
        "--framework", "torchtitan")  # fmt: skip


def test_fp8_estimate_is_faster_than_bf16_and_says_what_it_assumed(tmp_path: Path) -> None:
    from inproc import run_main

    out = {p: tmp_path / f"{p}.json" for p in ("bf16", "fp8")}
    done = {
        p: run_main(*ARGS, "--hardware", "1x8xH100-80GB", "--precision", p, "--json", out[p])
        for p in out
    }
    for p, result in done.items():
        assert result.returncode == 0, (p, result.stderr)
    fp8, bf16 = (json.loads(out[p].read_text()) for p in ("fp8", "bf16"))
    assert 1.0 < fp8["setup"]["tokens_per_s"] / bf16["setup"]["tokens_per_s"] < 2.0
    lines = done["fp8"].stdout.splitlines()
    assert any(line.startswith("  fp8 linears: ") and "dense FP8" in line for line in lines)
    assert "memory priced for: torchtitan, fp8" in done["fp8"].stdout
    assert fp8["error_bands"][0]["kind"] == "h100/torchtitan+fp8"
    assert not any("fp8 linears" in line for line in done["bf16"].stdout.splitlines())


def test_fp8_on_an_a100_is_one_line_exit_2_naming_the_gpu(tmp_path: Path) -> None:
    from inproc import run_main

    out = tmp_path / "a100.json"
    done = run_main(*ARGS, "--hardware", "1x8xA100-80GB", "--precision", "fp8", "--json", out)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--precision" in lines[0]
    assert "NVIDIA A100 80GB SXM has no FP8 peak" in lines[0] and "use bf16" in lines[0]
    assert not out.exists()
