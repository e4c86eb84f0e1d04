"""One settings object, built once by the CLI (or an embedding app) and passed explicitly.

Precedence: explicit argument, then environment (``TRAINWRIGHT_*``), then default.
Only ``Settings.load`` reads the environment.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tools.core.errors import InputError, shown

# Telemetry exporters of our dependencies try to reach the network, which is closed here and
# which users did not opt into. These are the variables each library documents.
TELEMETRY_OFF = {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "OTEL_SDK_DISABLED": "true",
    "ANONYMIZED_TELEMETRY": "False",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_TRACING": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
    # The LangGraph CLI's usage log and the dev server's check for a newer langgraph-api.
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGGRAPH_NO_VERSION_CHECK": "true",
}


# The faults tools/smoke/runner.py can inject for real (its INJECT_KINDS; tests check they match).
SMOKE_FAULTS = ("oom", "nan", "hang", "crash", "alloc")
# When an injected fault strikes: the first smoke run of a plan only, or every run.
SMOKE_INJECT_WHEN = ("first", "always")


# The bounds of the numbers a user sets, through the environment (``Settings.load``) or the
# CLI's flags for the same things (app.py NUMBER_FLAGS): a value outside is one line naming the
# variable or flag, exit 2. A time is a finite number of seconds above 0.
SMOKE_STEPS_MIN = 2
SMOKE_STEPS_MAX = 1_000_000
SMOKE_TIMEOUT_MAX_S = 86_400.0  # a day: a smoke run takes minutes
# What one smoke run may start on this machine: processes (ranks of a layout, "nodes") and
# sequences per rank per step.
SMOKE_LOCAL_RANKS_MAX = 64
SMOKE_MICRO_BATCH_MAX = 65_536  # a huge one still runs, and ends as oom under the cap
LLM_TIMEOUT_MAX_S = 3_600.0
MAX_REVIEW_ROUNDS = 20
MAX_MEMORY_CAP = 2**50  # 1 PiB, more than any machine holds
# name -> (type, least, most) of the numbers Settings.load reads from TRAINWRIGHT_<NAME>.
# Concurrent node slots of the served graph (graphs/cancel.py).
SERVE_MAX_ACTIVE_MAX = 64
ENV_NUMBERS: dict[str, tuple[type, float, float]] = {
    "smoke_steps": (int, SMOKE_STEPS_MIN, SMOKE_STEPS_MAX),
    "smoke_timeout_s": (float, 0.0, SMOKE_TIMEOUT_MAX_S),
    "smoke_stall_s": (float, 0.0, SMOKE_TIMEOUT_MAX_S),
    "max_review_rounds": (int, 1, MAX_REVIEW_ROUNDS),
    "llm_timeout_s": (float, 0.0, LLM_TIMEOUT_MAX_S),
    "serve_max_active": (int, 1, SERVE_MAX_ACTIVE_MAX),
}


def check_count(field: str, value: int, least: int, most: int) -> int:
    """``value`` if it is a whole number from ``least`` to ``most``; else InputError naming ``field``."""
    if not least <= value <= most:
        got = str(value) if abs(value) < 10**30 else f"a number of {len(str(abs(value)))} digits"
        raise InputError(field, f"must be a whole number from {least:,} to {most:,}, got {got}")
    return value


def check_seconds(field: str, value: float, most: float) -> float:
    """``value`` if it is a finite number of seconds above 0 and at most ``most``; else InputError."""
    if not (math.isfinite(value) and 0 < value <= most):
        raise InputError(
            field, f"must be a number of seconds above 0 and at most {most:,g}, got {value:g}"
        )
    return value


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
# The smallest memory cap accepted: below it not even the Python interpreter starts.
MIN_MEMORY_CAP = 64 * 2**20


def parse_memory_cap(text: str, field: str = "--memory-cap") -> int:
    """Parse a memory cap such as ``8GiB``, ``512MiB``, ``2G`` or ``off``; bytes, 0 for off.

    K/M/G/T are binary (KiB, MiB, ...) with or without ``iB``/``B``; a bare number is bytes.
    Raises InputError (naming ``field``) for anything else or a cap below 64 MiB.
    """
    if text.strip().lower() in ("off", "none", "0"):
        return 0
    match = _SIZE_RE.match(text)
    if match is None:
        raise InputError(
            field, f"expected a size such as 8GiB or 512MiB (or 'off'), got {shown(text, 40)}"
        )
    unit = (match.group(2) or "").lower()[:1]
    size = float(match.group(1)) * _SIZE_UNITS[unit]
    if not size <= MAX_MEMORY_CAP:  # also an overflow to inf
        raise InputError(field, f"must be at most 1024TiB (or 'off'), got {shown(text, 40)}")
    value = int(size)
    if value < MIN_MEMORY_CAP:
        raise InputError(field, f"must be at least 64MiB (or 'off'), got {shown(text, 40)}")
    return value


def disable_telemetry() -> None:
    """Switch off the telemetry of crewai, chromadb, LangSmith and the HF hub for this process."""
    for key, value in TELEMETRY_OFF.items():
        os.environ.setdefault(key, value)


def serve_home() -> Path:
    """The served graph's home when TRAINWRIGHT_HOME is unset: ``<user cache>/trainwright/serve``.

    The user cache is ``$XDG_CACHE_HOME``, else ``~/.cache``.
    """
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"  # XDG: only absolute
    return base / "trainwright" / "serve"


@dataclass(frozen=True)
class Settings:
    """Everything configurable about a run; tools receive it, the model never sees it."""

    home: Path = field(default_factory=lambda: Path(".trainwright"))
    out_dir: Path = field(default_factory=lambda: Path("out"))
    llm: str = "offline"
    base_url: str | None = None
    api_key: str | None = None
    max_review_rounds: int = 2
    max_agent_steps: int = 12
    smoke_steps: int = 30
    smoke_timeout_s: float = 300.0
    # A run that has reached a step and then shows no new step for this long (or for
    # STALL_STEP_FACTOR times its slowest step so far, if longer) is stopped as stalled, a
    # timeout, without waiting out smoke_timeout_s: a rank hung in a collective (0: off).
    smoke_stall_s: float = 120.0
    smoke_cpu_ranks: int = 2
    llm_timeout_s: float = 60.0
    # The most resident memory all processes of one smoke run may hold together, in bytes
    # (TRAINWRIGHT_SMOKE_MEMORY_CAP, e.g. "8GiB"); None: half of this machine's RAM
    # (tools/smoke/memory_cap.py default_memory_cap); 0: no cap.
    smoke_memory_cap: int | None = None
    knowledge_dir: Path | None = None
    # Testing aid, off by default: "KIND" or "KIND:first" makes the first smoke run of a plan
    # fail for real with KIND (oom, nan, hang, crash, alloc); "KIND:always" makes every run
    # fail. It exercises the review loop: after an injected oom the engineer must re-plan
    # with less memory, and the second round runs clean.
    smoke_inject: str | None = None
    # Set only where remote callers choose out_dir (the LangGraph server, graphs/serve.py):
    # their folder is then a name inside this root, and one resolving outside it is refused.
    # None (the CLI, the adapters): any path the caller names. See ``served``.
    serve_root: Path | None = None
    # Served only: how many graph nodes of served runs may work at once in the server
    # (TRAINWRIGHT_SERVE_MAX_ACTIVE); the others wait for a slot (graphs/cancel.py).
    serve_max_active: int = 2
    # Whether a graph node imports, before its first tool runs, every library the planning
    # graph imports lazily (tools/core/imports.py warm_up): needed wherever plans may run in
    # parallel threads of one process (a library caller, batch, chat, the server). The CLI's
    # `plan` runs one plan per process and turns it off: each library is imported when first
    # used, and one the plan does not use (transformers, most of tools/) is not imported.
    warm_imports: bool = True

    def __post_init__(self) -> None:
        """Reject a malformed ``smoke_inject`` or slot count here, not deep inside a run."""
        if self.serve_max_active < 1:
            raise InputError(
                "TRAINWRIGHT_SERVE_MAX_ACTIVE", f"must be at least 1, got {self.serve_max_active}"
            )
        if self.smoke_inject is not None:
            kind, _, when = self.smoke_inject.partition(":")
            if kind not in SMOKE_FAULTS or (when and when not in SMOKE_INJECT_WHEN):
                raise InputError(
                    "smoke_inject",
                    f"expected KIND or KIND:first|always with KIND one of {', '.join(SMOKE_FAULTS)}, "
                    f"got {self.smoke_inject!r}",
                )

    def smoke_fault(self, first_run: bool) -> str | None:
        """The fault to inject into a smoke run (``smoke_inject``), or None for a clean run."""
        if self.smoke_inject is None:
            return None
        kind, _, when = self.smoke_inject.partition(":")
        return kind if first_run or when == "always" else None

    @property
    def knowledge_index_dir(self) -> Path:
        """Where the chromadb index over the knowledge cards lives (default: under home)."""
        return self.knowledge_dir or self.home / "knowledge"

    @property
    def runs_dir(self) -> Path:
        """Where smoke runs keep their logs and temporary files."""
        return self.home / "runs"

    @property
    def checkpoint_db(self) -> Path:
        """The SQLite file that holds LangGraph checkpoints."""
        return self.home / "checkpoints.sqlite"

    def served(self) -> Settings:
        """These settings for serving (the LangGraph server), whose files stay out of its cwd.

        ``home``: TRAINWRIGHT_HOME, else ``serve_home()`` (a user cache folder), never the
        working folder (``langgraph dev`` watches it and reloads on a new file there).
        ``serve_root``: TRAINWRIGHT_SERVE_ROOT, else TRAINWRIGHT_OUT, else ``<home>/out``.
        """
        env = os.environ
        home = self.home if env.get("TRAINWRIGHT_HOME") else serve_home()
        root = (
            env.get("TRAINWRIGHT_SERVE_ROOT")
            or self.serve_root
            or (self.out_dir if env.get("TRAINWRIGHT_OUT") else home / "out")
        )
        return replace(self, home=home, serve_root=Path(root))

    def with_(self, **changes: Any) -> Settings:
        """Return a copy with ``changes`` applied (explicit arguments win)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def load(cls, **explicit: Any) -> Settings:
        """Build settings from explicit arguments, then ``TRAINWRIGHT_*`` variables, then defaults."""
        env = os.environ
        from_env: dict[str, Any] = {}
        if "TRAINWRIGHT_HOME" in env:
            from_env["home"] = Path(env["TRAINWRIGHT_HOME"])
        if "TRAINWRIGHT_OUT" in env:
            from_env["out_dir"] = Path(env["TRAINWRIGHT_OUT"])
        if "TRAINWRIGHT_KNOWLEDGE_DIR" in env:
            from_env["knowledge_dir"] = Path(env["TRAINWRIGHT_KNOWLEDGE_DIR"])
        if "TRAINWRIGHT_LLM" in env:
            from_env["llm"] = env["TRAINWRIGHT_LLM"]
        if "TRAINWRIGHT_BASE_URL" in env:
            from_env["base_url"] = env["TRAINWRIGHT_BASE_URL"]
        if "TRAINWRIGHT_API_KEY" in env:
            from_env["api_key"] = env["TRAINWRIGHT_API_KEY"]
        if env.get("TRAINWRIGHT_SMOKE_MEMORY_CAP"):
            from_env["smoke_memory_cap"] = parse_memory_cap(
                env["TRAINWRIGHT_SMOKE_MEMORY_CAP"], "TRAINWRIGHT_SMOKE_MEMORY_CAP"
            )
        if env.get("TRAINWRIGHT_SMOKE_INJECT"):
            from_env["smoke_inject"] = env["TRAINWRIGHT_SMOKE_INJECT"]
        for name, (conv, least, most) in ENV_NUMBERS.items():
            key = "TRAINWRIGHT_" + name.upper()
            if key in env:
                from_env[name] = _env_number(key, env[key], conv, least, most)
        return cls().with_(**from_env).with_(**explicit)


def _env_number(key: str, text: str, conv: type, least: float, most: float) -> int | float:
    """The number in variable ``key``, within its bounds; InputError naming ``key`` otherwise."""
    try:
        value = conv(text)
    except ValueError:
        what = "whole number" if conv is int else "number"
        raise InputError(key, f"must be a {what}, got {shown(text, 40)}") from None
    if conv is int:
        return check_count(key, value, int(least), int(most))
    return check_seconds(key, value, most)
