"""Copy a plan's files (report, plan.json, DeepSpeed config, launch files) into a folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tools.core.errors import InputError
from tools.core.outputs import claim, copy_file, write_file


def save_plan(plan: dict[str, Any], directory: str) -> list[Path]:
    """Copy a plan's report, plan.json, DeepSpeed config and launch files into ``directory``.

    Each file keeps its base name and lands directly in ``directory``, except a launch file in
    a folder of the plan's (``trainer/train.py``), which keeps that place: launch.sh names it
    so. A destination that would resolve outside ``directory`` (a symlink out of it, a name
    with ``..``) is refused, as is a path with NUL. A
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
    for name, path in ((plan.get("launch") or {}).get("files") or {}).items():
        sources[_launch_name(str(name), Path(path))] = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    root = target.resolve()
    for name in sources:
        dest = root / name
        if root not in dest.resolve().parents or dest.is_symlink():
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


def _launch_name(name: str, path: Path) -> str:
    """Where a launch file goes: its name in the plan (``trainer/train.py``), else its base name."""
    parts = Path(name).parts
    plain = not Path(name).is_absolute() and ".." not in parts and parts[-1:] == (path.name,)
    return name if plain and len(parts) > 1 else path.name
