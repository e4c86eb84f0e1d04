"""Copy a plan's files (report, plan.json, DeepSpeed config, launch files) into a folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tools.core.errors import InputError
from tools.core.outputs import claim, copy_file, write_file


def save_plan(plan: dict[str, Any], directory: str) -> list[Path]:
    """Copy a plan's report, plan.json, DeepSpeed config and launch files into ``directory``.

    Each file keeps its base name and lands directly in ``directory``: a destination that
    would resolve anywhere else (a symlink out of it) is refused, as is a path with NUL. A
    non-empty folder trainwright did not write is refused, and no file of the user's there is
    ever replaced.
    """
    if not directory.strip():
        raise InputError("/save", "give a directory, e.g. /save saved/llama")
    if "\x00" in directory:
        raise InputError("/save", "the path contains a NUL character")
    target = Path(directory).expanduser()
    if target.exists() and not target.is_dir():
        raise InputError("/save", f"{target} exists and is not a directory")
    sources: dict[str, Path] = {}
    for path in (plan.get("report") or {}).values():
        if path:
            sources[Path(path).name] = Path(path)
    for path in ((plan.get("launch") or {}).get("files") or {}).values():
        sources[Path(path).name] = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    root = target.resolve()
    for name in sources:
        dest = root / name
        if dest.resolve().parent != root or dest.is_symlink():
            raise InputError("/save", f"{dest} would be written outside {root}")
    # A folder of the user's is refused; one /save made before is replaced file by file, as
    # long as nobody changed those files since (tools/core/outputs.py).
    names = [n for n, source in sources.items() if source.is_file()]
    if plan.get("deepspeed_config") is not None and "ds_config.json" not in sources:
        names.append("ds_config.json")
    claim(root, field="/save", names=names, force_flag=None)
    if plan.get("deepspeed_config") is not None and "ds_config.json" not in sources:
        write_file(
            root, "ds_config.json", json.dumps(plan["deepspeed_config"], indent=2), field="/save"
        )
    copied = []
    for name, source in sorted(sources.items()):
        if not source.is_file():
            continue
        copy_file(root, name, source, field="/save")  # keeps launch scripts executable
        copied.append(root / name)
    return copied
