"""Checks of generated launch files against the frameworks' own code, shared by the test tiers.

torchtitan 0.2.2's ``JobConfig`` dataclasses (tests/data/torchtitan_job_config.py, read with
``ast``: importing it needs torch and torchtitan) and Megatron-DeepSpeed's argument parser
(tests/data/megatron_deepspeed_arguments.py); each file's header names its source commit.
"""

from __future__ import annotations

import ast
import importlib.util
import typing
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

DATA = Path(__file__).parent / "data"
JOB_CONFIG = DATA / "torchtitan_job_config.py"
MEGATRON_PARSER = DATA / "megatron_deepspeed_arguments.py"


def job_config_classes() -> dict[str, dict[str, Any]]:
    """Class name -> field name -> its annotation, evaluated (Literal, unions, lists)."""
    tree = ast.parse(JOB_CONFIG.read_text())
    names = {"Literal": Literal, "Any": Any}
    classes: dict[str, dict[str, Any]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {
                item.target.id: ast.unparse(item.annotation)
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
    for fields in classes.values():
        for key, text in fields.items():
            fields[key] = text if text in classes else eval(text, names)  # noqa: S307
    return classes


def toml_value_fits(value: Any, annotation: Any) -> bool:
    """Whether a TOML value is of the field's type (bool is not an int here)."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin in (typing.Union, __import__("types").UnionType):
        return any(toml_value_fits(value, arm) for arm in typing.get_args(annotation))
    if origin is list:
        return isinstance(value, list)
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def torchtitan_key_errors(toml: dict[str, Any]) -> list[str]:
    """Every TOML section or key torchtitan 0.2.2 would refuse, or whose value has the wrong type."""
    classes = job_config_classes()
    sections = classes["JobConfig"]
    wrong = []
    for section, values in toml.items():
        if section not in sections:
            wrong.append(f"[{section}] is no JobConfig section")
            continue
        wrong += _table_errors(classes, section, sections[section], values)
    return wrong


def _table_errors(
    classes: dict[str, dict[str, Any]], where: str, name: str, values: dict[str, Any]
) -> list[str]:
    """A table's unknown keys and wrongly typed values; a nested table ([a.b.c]) recursively."""
    fields, wrong = classes[name], []
    for key, value in values.items():
        if key not in fields:
            wrong.append(f"[{where}] {key} is no {name} field")
        elif isinstance(fields[key], str) and fields[key] in classes:
            if not isinstance(value, dict):
                wrong.append(f"[{where}] {key} = {value!r} is not a {fields[key]} table")
            else:
                wrong += _table_errors(classes, f"{where}.{key}", fields[key], value)
        elif not toml_value_fits(value, fields[key]):
            wrong.append(f"[{where}] {key} = {value!r} is not {fields[key]}")
    return wrong


def megatron_parser() -> ModuleType:
    """Megatron-DeepSpeed's ``megatron/arguments.py`` (parse_args, validate_args), loaded fresh."""
    spec = importlib.util.spec_from_file_location("megatron_deepspeed_arguments", MEGATRON_PARSER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
