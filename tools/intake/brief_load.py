"""A brief file or dict into a validated TrainingBrief: strict YAML/JSON, one line per error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tools.core.errors import InputError, shown
from tools.core.schemas import TrainingBrief

MAX_BRIEF_BYTES = 1_000_000


def _first_error(exc: ValidationError, prefix: str = "brief") -> InputError:
    """Collapse pydantic's report into one line naming the first bad field."""
    errors = exc.errors()
    # A union field (model) reports one error per member; the member-type mismatches say
    # little, so prefer an error from inside the member the user meant: a mapping without
    # `params` means a shape, not a size that lacks its count.
    mismatch = {"string_type", "model_type", "model_attributes_type", "dict_type"}

    no_params = any(
        e.get("type") == "missing" and tuple(e.get("loc", ())) == ("model", "ModelParams", "params")
        for e in errors
    )
    meant = [e for e in errors if not (no_params and e.get("loc", ())[1:2] == ("ModelParams",))]
    err = next((e for e in meant if e.get("type") not in mismatch), None)
    err = err or next((e for e in errors if e.get("type") not in mismatch), errors[0])
    member = ("ModelParams", "ModelShape", "str", "function-after")
    loc = [str(p) for p in err.get("loc", ()) if not str(p).startswith(member)]
    field = ".".join([prefix, *loc]) if loc else prefix
    msg = err.get("msg", "invalid value")
    if err.get("type") == "missing":
        msg = "is required"
    elif err.get("type") == "extra_forbidden":
        msg = "is not a brief field (the README lists the brief format)"
    value = err.get("input")
    if (
        err.get("type") not in {"missing", "extra_forbidden"}
        and isinstance(value, str | int | float)
        and not isinstance(value, bool)
    ):
        msg = f"{msg} (got {shown(value, 60) if isinstance(value, str) else _number(value)})"
    return InputError(shown_field(field), msg.replace("Value error, ", ""))


def _number(value: int | float) -> str:
    """A number for an error line: a 5000-digit integer as its first digits and its length."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"


def shown_field(field: str) -> str:
    """A field path for an error line; an unknown key a brief invented is cut and escaped."""
    if field.isprintable() and len(field) <= 80:
        return field
    # Escaped without quotes, so the path still starts where it is (brief.team.\x1f).
    text = field.encode("unicode_escape").decode("ascii")
    return text if len(text) <= 80 else f"{text[:60]}..."


def brief_from_dict(data: Any) -> TrainingBrief:
    """Validate a mapping as a TrainingBrief, raising InputError naming the first bad field."""
    if not isinstance(data, dict):
        raise InputError("brief", f"must be a mapping of brief fields, got {type(data).__name__}")
    if data.get("model") is None and data.get("task") != "agent-app":
        raise InputError("brief.model", "is required (only an agent-app brief may omit it)")
    try:
        return TrainingBrief.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None


class _DuplicateKey(ValueError):
    """A key given twice in one mapping of a brief: which value was meant is unknowable."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that names a key twice (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the base class reports it
                break
            if duplicate:
                raise _DuplicateKey(
                    f"key {shown(key, 60)} appears twice (line {key_node.start_mark.line + 1})"
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(f"key {shown(key, 60)} appears twice")
        data[key] = value
    return data


def _parse_brief_text(text: str, *, json_file: bool) -> Any:
    """The brief's data: JSON or YAML (safe types only), every key at most once per mapping."""
    if json_file:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_brief(path: str | Path) -> TrainingBrief:
    """Read a YAML or JSON brief file."""
    p = Path(path)
    try:
        if not p.is_file():
            raise InputError("--brief", f"no such file: {shown(p, 120)}")
        if p.stat().st_size > MAX_BRIEF_BYTES:
            raise InputError("--brief", f"{shown(p, 120)} is larger than {MAX_BRIEF_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError("--brief", f"{shown(p, 120)} is not UTF-8 text") from None
    except (OSError, ValueError) as exc:  # a name too long, a NUL, no permission
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise InputError("--brief", f"cannot read {shown(p, 120)}: {why}") from None
    try:
        data = _parse_brief_text(text, json_file=p.suffix.lower() == ".json")
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        if isinstance(exc, json.JSONDecodeError):
            line = exc.lineno - 1
        where = f" (line {line + 1})" if line is not None else ""
        raise InputError("--brief", f"{shown(p, 120)} is not valid YAML/JSON{where}") from None
    except _DuplicateKey as exc:
        raise InputError("--brief", f"{shown(p, 120)}: {exc}") from None
    except RecursionError:
        raise InputError(
            "--brief", f"{shown(p, 120)} is nested too deeply (a brief is a few levels deep)"
        ) from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise InputError("--brief", f"{shown(p, 120)}: {str(exc).split(';')[0]}") from None
    if data is None:
        raise InputError("--brief", f"{p} is empty")
    return brief_from_dict(data)
