"""A hardware spec whose GPU type leaves the part open says which part it took.

Before, `profile --hardware 8xH100` and `estimate --hardware 8xA100` resolved the plain name to
the catalog's default part (H100 SXM5 80GB; A100 80GB SXM) without a word, where a request
("8 A100s") says "assumed A100-80GB: the request does not say 40 or 80 GB, nor SXM or PCIe".
"""

from __future__ import annotations

import json
from typing import Any

import pytest


@pytest.mark.parametrize(
    ("spec", "said"),
    [("8xH100", "assumed H100-80GB"), ("2x8xA100", "assumed A100-80GB"), ("4xV100", "16 or 32 GB")],
)
def test_profile_says_the_part_a_plain_name_took(cli_main: Any, spec: str, said: str) -> None:
    done = cli_main("profile", "--hardware", spec)
    assert done.returncode == 0, done.stderr
    assert said in done.stdout


def test_profile_json_stays_json_and_the_assumption_goes_to_stderr(cli_main: Any) -> None:
    done = cli_main("profile", "--hardware", "8xA100", "--json", "/dev/null")
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)
    assert "assumed A100-80GB" in done.stderr


def test_an_exact_part_is_not_called_assumed(cli_main: Any) -> None:
    done = cli_main("profile", "--hardware", "1x8xH100-80GB")
    assert done.returncode == 0 and "assumed" not in done.stdout + done.stderr


def test_estimate_says_the_part_a_plain_name_took(cli_main: Any) -> None:
    done = cli_main("estimate", "--model", "gpt2", "--seq-len", "512", "--hardware", "8xA100")
    assert done.returncode == 0, done.stderr
    assert "assumed: hardware: assumed A100-80GB" in done.stdout
    exact = cli_main(
        "estimate", "--model", "gpt2", "--seq-len", "512", "--hardware", "1x8xA100-80GB"
    )
    assert "assumed: hardware" not in exact.stdout


def test_estimate_from_a_brief_without_hardware_flag_still_runs(cli_main: Any, tmp_path) -> None:
    brief = tmp_path / "b.yaml"
    brief.write_text("model: gpt2\ntask: pretrain\nseq_len: 512\nhardware: 1x8xA100-80GB\n")
    done = cli_main("estimate", "--brief", str(brief))
    assert done.returncode == 0, done.stderr
    assert "assumed: hardware" not in done.stdout
