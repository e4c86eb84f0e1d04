"""Two briefs with one file name in a batch: the renamed one says which file it is.

Before, `report x/ y/` with x/a.yaml and y/a.yaml wrote a/ and a-2/ and said "a-2: planning",
"a-2: ok" with no word of which file a-2 was (tools/intake/brief_files.py, graphs/batch.py).
"""

from __future__ import annotations

from pathlib import Path

from tools.intake.brief_files import find_briefs, folder_note


def test_a_renamed_brief_folder_names_its_file(tmp_path: Path) -> None:
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.yaml").write_text("model: gpt2\n")
    first, second = find_briefs([tmp_path / "x", tmp_path / "y"])
    assert (first.name, second.name) == ("a", "a-2")
    assert folder_note(first) == ""  # a folder named for its file needs no word
    assert folder_note(second) == f" (from {second.path}: 'a' is another brief's folder)"


def test_a_stem_made_safe_names_its_file(tmp_path: Path) -> None:
    (tmp_path / "my brief.yaml").write_text("model: gpt2\n")
    (job,) = find_briefs([tmp_path])
    assert job.name == "my_brief" and str(job.path) in folder_note(job)
