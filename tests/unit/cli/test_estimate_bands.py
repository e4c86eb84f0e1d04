"""``estimate`` in process: the speed and peak memory predictions carry their error bands."""

from __future__ import annotations

import json
from pathlib import Path

from tools.planning.bands import lookup
from tools.research.hardware import find_gpu


def test_estimate_json_and_text_carry_the_bands(tmp_path: Path) -> None:
    from inproc import run_main

    out = tmp_path / "est.json"
    done = run_main(
        "estimate", "--model", "llama-3-8b", "--hardware", "1x8xH100-80GB", "--framework",
        "fsdp", "--json", out,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    bands = {b["quantity"]: b for b in json.loads(out.read_text())["error_bands"]}
    assert set(bands) == {"tokens_per_s", "peak_memory"}
    for quantity, band in bands.items():
        want = lookup(quantity, find_gpu("H100-80GB"), "fsdp")
        assert band == want.model_dump(mode="json")
        assert f"  error band: {want.text}" in done.stdout.splitlines()
    assert bands["tokens_per_s"]["matched"] == "h100/fsdp" and bands["tokens_per_s"]["n"] >= 1


def test_estimate_on_an_uncalibrated_gpu_says_so(tmp_path: Path) -> None:
    from inproc import run_main

    out = tmp_path / "est.json"
    done = run_main("estimate", "--model", "llama-3-8b", "--hardware", "1x8xMI300X",
                    "--json", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    speed = json.loads(out.read_text())["error_bands"][0]
    assert speed["quantity"] == "tokens_per_s" and speed["band"] is None and speed["n"] == 0
    assert "no published runs of this kind (mi300/*): uncalibrated" in done.stdout
