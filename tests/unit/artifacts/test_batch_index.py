"""The batch index names the brief file of every folder.

Two briefs named a.yaml in different folders plan into a/ and a-2/; the terminal said which
file the second folder is, the index (index.md, index.html) did not.
"""

from __future__ import annotations

from pathlib import Path

from tools.artifacts.index import BriefOutcome, render_index_html, render_index_markdown


def _outcomes(tmp_path: Path) -> list[BriefOutcome]:
    summary = {"model": "gpt2", "strategy": "ddp", "per_gpu_gb": 3.2, "tokens_per_s": 1000.0}
    return [
        BriefOutcome("a", tmp_path / "team1" / "a.yaml", "ok", summary),
        BriefOutcome("a-2", tmp_path / "team2" / "a.yaml", "ok", summary),
        BriefOutcome("b", tmp_path / "b|c.yaml", "failed", error="brief.seq_len: must be > 0"),
    ]


def test_each_index_row_names_its_brief_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    md = render_index_markdown(_outcomes(tmp_path))
    rows = [line for line in md.splitlines() if line.startswith("| a")]
    assert [row.split(" | ")[1] for row in rows] == ["team1/a.yaml", "team2/a.yaml"]
    header, rule = md.splitlines()[4:6]
    assert header.count("|") == rule.count("|")  # one alignment cell per column
    # A '|' in a file name does not break the table.
    assert "| b | b\\|c.yaml | error: brief.seq_len: must be > 0 |" in md
    page = render_index_html(_outcomes(tmp_path))
    assert "<td>team2/a.yaml</td>" in page and "<td>b|c.yaml</td>" in page


def test_a_brief_far_from_the_working_folder_is_named_in_full(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "w" / "x" / "y").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "w")
    assert " | ../team1/a.yaml | " in render_index_markdown(_outcomes(tmp_path)[:1])
    monkeypatch.chdir(tmp_path / "w" / "x" / "y")
    assert f" | {tmp_path / 'team1' / 'a.yaml'} | " in render_index_markdown(
        _outcomes(tmp_path)[:1]
    )
