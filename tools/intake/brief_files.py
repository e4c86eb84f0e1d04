"""Brief files named on the command line, or found in the folders named, for a batch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tools.core.errors import InputError

BRIEF_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class BriefJob:
    """One brief to plan: its file and the folder name it gets under ``--out``."""

    name: str
    path: Path


def find_briefs(paths: Iterable[Path]) -> list[BriefJob]:
    """Brief files named directly or found (not recursively) in the directories given.

    Folder names are the file stems (characters other than letters, digits, ``._-`` become
    ``_``), made unique, ignoring case, with ``-2``, ``-3``... in input order.
    Raises InputError for a path that does not exist, or when no brief is found at all.
    """
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.is_file() and f.suffix in BRIEF_SUFFIXES)
        elif p.is_file():
            files.append(p)
        else:
            raise InputError("report", f"no such file or directory: {p}")
    if not files:
        raise InputError("report", "no brief files (.yaml, .yml, .json) in the paths given")
    jobs: list[BriefJob] = []
    used: set[str] = set()  # casefolded: A.yaml and a.yaml must not share a folder on macOS
    for f in dict.fromkeys(f.resolve() for f in files):  # a file named twice runs once
        # Leading dots off: a file named "...yaml" (stem "..") must not name out_dir's parent.
        safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in f.stem)
        stem = safe.lstrip(".")[:100] or "brief"
        name, n = stem, 1
        # "a b.yaml", "a_b.yaml" and "a_b-2.yaml" all want a_b or a_b-2: each gets its own.
        while name.casefold() in used:
            n += 1
            name = f"{stem}-{n}"
        used.add(name.casefold())
        jobs.append(BriefJob(name, f))
    return jobs


def folder_note(job: BriefJob) -> str:
    """The words after a batch line's name when the folder is not the file's stem.

    Before, x/a.yaml and y/a.yaml were planned as "a" and "a-2" and no line said which file
    "a-2" was; a renamed (or made-safe) folder now names its file.
    """
    if job.name == job.path.stem:
        return ""
    stem = job.name.rsplit("-", 1)[0]
    if stem.casefold() == job.path.stem.casefold() and stem != job.name:
        return f" (from {job.path}: {stem!r} is another brief's folder)"
    return f" (from {job.path})"
