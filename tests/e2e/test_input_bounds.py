"""Every bad input ends as exit 2 with one bounded line naming the field, through the real CLI.

The table was built by trying inputs against ``app.py estimate`` / ``plan --no-smoke`` /
``smoke``: before the fixes, each class here ended as "unexpected error" with exit 1 (huge
integers, deep nesting, models over 2^63 parameters, unwritable output paths), passed
silently (``true`` as a count, a key given twice, a config.json with 100,000 or -1 layers), or
printed a multi-line or 900 KB error line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from inproc import run_main

from tools.core.errors import MAX_ERROR_CHARS, one_line
from tools.core.schemas import MAX_LAYERS
from tools.research.model_catalog import check_config_bounds, list_models

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "trainwright: error: "
LLAMA = "llama-3-8b"  # catalog counts are shipped: no meta build, each case takes ~0.5 s
TINY = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}


def _config(**fields: object) -> str:
    return json.dumps({**TINY, "num_hidden_layers": 2, "intermediate_size": 128, **fields})


DEEP_YAML = "model: llama-3-8b\nteam: " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_JSON = '{"model": "llama-3-8b", "team": ' + "[" * 100_000 + "]" * 100_000 + "}"
LONG = "a" * 300

# name -> (files to write, CLI arguments, what the line must name)
CASES: dict[str, tuple[dict[str, str], list[str], str]] = {
    # huge numbers
    "layers-1e400": (
        {"b.yaml": "model: {layers: 1e400, hidden: 64, heads: 4, vocab: 100}\n"},
        ["estimate", "--brief", "b.yaml"],
        "brief.model.layers",
    ),
    "layers-23-digits": (
        {"b.yaml": "model: {layers: 99999999999999999999999, hidden: 64, heads: 4, vocab: 100}\n"},
        ["estimate", "--brief", "b.yaml"],
        "brief.model.layers",
    ),
    "gpus-23-digits": (
        {},
        ["estimate", "--model", LLAMA, "--hardware", "1x99999999999999999999999xA100-80GB"],
        "hardware",
    ),
    "seq-len-70-digits": (
        {"b.yaml": f"model: {LLAMA}\nseq_len: {'9' * 70}\n"},
        ["estimate", "--brief", "b.yaml"],
        "brief.seq_len",
    ),
    "seq-len-5000-digits-json": (
        {"b.json": f'{{"model": "{LLAMA}", "seq_len": {"9" * 5000}}}'},
        ["estimate", "--brief", "b.json"],
        "--brief",
    ),
    "dataset-tokens-1e400": (
        {"b.yaml": f"model: {LLAMA}\ndataset_tokens: 1e400\n"},
        ["estimate", "--brief", "b.yaml"],
        "brief.dataset_tokens",
    ),
    "params-nan": (
        {"b.yaml": "model: {params: .nan}\n"},
        ["estimate", "--brief", "b.yaml"],
        "brief.model.params",
    ),
    # deep nesting (RecursionError)
    "deep-yaml": ({"b.yaml": DEEP_YAML}, ["estimate", "--brief", "b.yaml"], "--brief"),
    "deep-json": ({"b.json": DEEP_JSON}, ["estimate", "--brief", "b.json"], "--brief"),
    # booleans as counts
    "seq-len-true": (
        {"b.yaml": f"model: {LLAMA}\nseq_len: true\n"},
        ["estimate", "--brief", "b.yaml"],
        "brief.seq_len",
    ),
    "global-batch-true": (
        {"b.yaml": f"model: {LLAMA}\nglobal_batch_size: true\n"},
        ["estimate", "--brief", "b.yaml"],
        "brief.global_batch_size",
    ),
    "params-true": (
        {"b.yaml": "model: {params: true}\n"},
        ["estimate", "--brief", "b.yaml"],
        "brief.model.params",
    ),
    "layers-false": (
        {"b.yaml": "model: {layers: false, hidden: 64, heads: 4, vocab: 100}\n"},
        ["estimate", "--brief", "b.yaml"],
        "brief.model.layers",
    ),
    # a key given twice
    "duplicate-yaml-key": (
        {"b.yaml": f"model: {LLAMA}\nseq_len: 512\nseq_len: 1024\n"},
        ["estimate", "--brief", "b.yaml"],
        "'seq_len' appears twice (line 3)",
    ),
    "duplicate-nested-yaml-key": (
        {"b.yaml": f"model: {LLAMA}\nteam:\n  experience: expert\n  experience: beginner\n"},
        ["estimate", "--brief", "b.yaml"],
        "'experience' appears twice (line 4)",
    ),
    "duplicate-json-key": (
        {"b.json": f'{{"model": "{LLAMA}", "model": "gpt2"}}'},
        ["estimate", "--brief", "b.json"],
        "'model' appears twice",
    ),
    # config.json files get a brief shape's bounds, before anything is built
    "config-100000-layers": (
        {"c.json": _config(num_hidden_layers=100_000)},
        ["estimate", "--model", "c.json"],
        "model.num_hidden_layers",
    ),
    "config-negative-layers": (
        {"c.json": _config(num_hidden_layers=-1)},
        ["estimate", "--model", "c.json"],
        "model.num_hidden_layers",
    ),
    "config-true-layers": (
        {"c.json": _config(num_hidden_layers=True)},
        ["estimate", "--model", "c.json"],
        "model.num_hidden_layers",
    ),
    "config-huge-vocab": (
        {"c.json": _config(vocab_size=2**40)},
        ["estimate", "--model", "c.json"],
        "model.vocab_size",
    ),
    "config-huge-width": (
        {"c.json": _config(hidden_size=2**40, intermediate_size=2**40)},
        ["estimate", "--model", "c.json"],
        "model.hidden_size",
    ),
    "config-too-many-experts": (
        {"c.json": _config(model_type="mixtral", num_local_experts=100_000)},
        ["estimate", "--model", "c.json"],
        "model.num_local_experts",
    ),
    "config-over-2-63-params": (
        # every size within its bound, their product ~3e22 parameters (> 2^63 ~ 9.2e18)
        {
            "c.json": _config(
                model_type="mixtral",
                num_hidden_layers=1000,
                hidden_size=1_000_000,
                num_attention_heads=1000,
                intermediate_size=10_000_000,
                num_local_experts=1024,
            )
        },
        ["estimate", "--model", "c.json"],
        "parameters",
    ),
    "config-nested-text-config": (
        {"c.json": json.dumps({**TINY, "text_config": {"num_hidden_layers": 10**6}})},
        ["estimate", "--model", "c.json"],
        "model.text_config.num_hidden_layers",
    ),
    "config-float-layers-multiline-error": (
        {"c.json": _config(num_hidden_layers=1e300)},
        ["estimate", "--model", "c.json"],
        "model",
    ),
    "config-5000-digit-int": (
        {"c.json": '{"model_type": "llama", "num_hidden_layers": ' + "9" * 5000 + "}"},
        ["estimate", "--model", "c.json"],
        "model",
    ),
    "config-deep-nesting": (
        {"c.json": '{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"},
        ["estimate", "--model", "c.json"],
        "nested too deeply",
    ),
    "shape-over-the-parameter-bound": (
        {"b.yaml": "model: {layers: 1000, hidden: 999000, heads: 1000, vocab: 10000000}\n"},
        ["estimate", "--brief", "b.yaml"],
        "model",
    ),
    # huge and multi-line values in the error line
    "task-900-kb": (
        {"b.yaml": f"model: {LLAMA}\ntask: '{'y' * 900_000}'\n"},
        ["estimate", "--brief", "b.yaml"],
        "brief.task",
    ),
    "unknown-key-900-kb": (
        {"b.json": json.dumps({"model": LLAMA, "z" * 900_000: 1})},
        ["estimate", "--brief", "b.json"],
        "brief.",
    ),
    "hardware-with-newline-and-escape": (
        {},
        ["estimate", "--model", LLAMA, "--hardware", "1x8\n\x1b[31mfake: line"],
        "hardware",
    ),
    "hardware-100-kb": (
        {},
        ["estimate", "--model", LLAMA, "--hardware", "x" * 100_000],
        "hardware",
    ),
    # output paths that cannot be written: refused before any work
    "out-under-a-file": (
        {"afile": "x", "b.yaml": f"model: {LLAMA}\n"},
        ["plan", "--brief", "b.yaml", "--no-smoke", "--out", "afile/sub"],
        "--out",
    ),
    "out-under-proc": (
        {"b.yaml": f"model: {LLAMA}\n"},
        ["plan", "--brief", "b.yaml", "--no-smoke", "--out", "/proc/trainwright-out"],
        "--out",
    ),
    "out-name-too-long": (
        {"b.yaml": f"model: {LLAMA}\n"},
        ["plan", "--brief", "b.yaml", "--no-smoke", "--out", LONG],
        "--out",
    ),
    "plan-json-under-a-file": (
        {"afile": "x", "b.yaml": f"model: {LLAMA}\n"},
        ["plan", "--brief", "b.yaml", "--no-smoke", "--json", "afile/plan.json"],
        "--json",
    ),
    "json-under-proc": (
        {},
        ["estimate", "--model", LLAMA, "--json", "/proc/trainwright.json"],
        "--json",
    ),
    "json-is-a-directory": ({}, ["estimate", "--model", LLAMA, "--json", "."], "--json"),
    "json-name-too-long": ({}, ["estimate", "--model", LLAMA, "--json", LONG], "--json"),
    "brief-name-too-long": ({}, ["estimate", "--brief", LONG + ".yaml"], "--brief"),
    "smoke-run-dir-under-a-file": (
        {"afile": "x"},
        ["smoke", "--model", "gpt2", "--run-dir", "afile/run"],
        "--run-dir",
    ),
    "profile-json-under-proc": (
        {},
        ["profile", "--hardware", "1x8xA100-80GB", "--json", "/proc/p.json"],
        "--json",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_bounded_line(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, args, names = CASES[name]
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    monkeypatch.setenv("TRAINWRIGHT_DEBUG", "")
    started = time.monotonic()
    proc = run_main(*args, cwd=tmp_path)  # the CLI's main in process (inproc.py)
    elapsed = time.monotonic() - started
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-600:])
    assert len(lines) == 1, proc.stderr[-2000:]
    line = lines[0]
    assert line.startswith(PREFIX), line
    assert len(line) <= len(PREFIX) + MAX_ERROR_CHARS, len(line)
    assert line.isprintable(), repr(line)
    assert names in line, line
    assert proc.stdout == ""
    # Nothing is built or planned first: a refused input is refused within seconds.
    assert elapsed < 20, f"{elapsed:.1f} s"
    assert not (tmp_path / "out").exists()


def test_a_config_of_100000_layers_is_refused_before_transformers_is_imported(
    tmp_path: Path,
) -> None:
    # The bound holds for any caller of lookup_model, not just the CLI: no meta model is built.
    (tmp_path / "c.json").write_text(_config(num_hidden_layers=100_000))
    code = (
        "import sys; from tools.core.errors import InputError\n"
        "from tools.research.model_catalog import lookup_model\n"
        "try:\n"
        f"    lookup_model({str(tmp_path / 'c.json')!r}, 128)\n"
        "except InputError as exc:\n"
        "    print(exc)\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.splitlines() == [
        f"model.num_hidden_layers: layers must be a whole number from 0 to {MAX_LAYERS:,}, "
        "got 100000",
        "False False",
    ], out.stderr[-2000:]


def test_a_50_mb_config_is_refused_by_its_size_without_reading_it(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    with config.open("w") as fh:
        fh.write('{"model_type": "llama", "pad": "')
        fh.write("a" * (50 * 2**20))
        fh.write('"}')
    started = time.monotonic()
    proc = run_main("estimate", "--model", str(config), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1
    assert "bytes; a config.json is at most 4,194,304" in proc.stderr, proc.stderr
    assert time.monotonic() - started < 20


def test_every_catalog_config_is_within_the_bounds() -> None:
    from tools.research.model_catalog import _catalog_config

    for model_id in list_models():
        check_config_bounds(_catalog_config(model_id))


def test_one_line_escapes_and_bounds_what_it_shows() -> None:
    text = "brief.task: bad (got '" + "y" * 900_000 + "')\nsecond\x1b[2J line\tend"
    line = one_line(text)
    assert len(line) == MAX_ERROR_CHARS
    assert line.isprintable() and "\n" not in line and "\x1b" not in line
    assert line.startswith("brief.task: bad (got 'yyy") and line.endswith("line end")
    assert "..." in line
    assert one_line("a\nb") == "a / b"
    assert one_line("short") == "short"


def test_no_code_refers_to_a_document_the_repository_lacks() -> None:
    # An error once pointed at a DESIGN.md that is not in the repository.
    import re

    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    names = {Path(f).name for f in tracked}
    missing = []
    for file in tracked:
        if not file.endswith((".py", ".yaml", ".toml")) or file.startswith("tests/"):
            continue
        text = (ROOT / file).read_text(encoding="utf-8", errors="replace")
        for ref in re.findall(r"\b[A-Z][A-Z_]+\.md\b", text):
            if ref not in names:
                missing.append(f"{file}: {ref}")
    assert missing == []
