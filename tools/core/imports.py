"""The one import warm-up: what the planning graph imports lazily, imported once per process.

Python's per-module import locks do not cover packages with import cycles: a thread that
imports one while another thread does can be handed the half-initialised module. Twenty plans
started at once on one compiled graph hit it ("cannot import name 'GatheredParameters' from
partially initialized module 'deepspeed.runtime.zero'"). So the first node to run in a process
(and a batch, before its thread pool starts) imports them all while other threads wait.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import pkgutil
import sys
import threading
from collections.abc import Iterable

# Imported lazily by the tools: DeepSpeed validates configs, the researcher embeds its query
# in numpy (knowledge.minilm; chromadb only when the index is built), the reporter draws with
# matplotlib.
LAZY_IMPORTS = (
    "numpy",
    "torch",
    "transformers",
    "deepspeed",
    "deepspeed.runtime.config",
    "deepspeed.runtime.lr_schedules",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
    "markdown_it",
    "chromadb",
    "langchain_core.messages",
    "langchain_core.utils.function_calling",
    "langgraph.config",
    "knowledge.minilm",
    "tokenizers",
)

_LOCK = threading.Lock()
_warmed = False


def import_deepspeed_quietly() -> None:
    """Import DeepSpeed with its logger on stderr, showing errors only.

    DeepSpeed's logger writes to stdout (deepspeed/utils/logging.py) and warns at import and
    while parsing; our stdout is the CLI's answer, so keep it clean for scripts.
    """
    if "deepspeed" not in sys.modules:
        # The handler captures sys.stdout when it is created, at import.
        with contextlib.redirect_stdout(sys.stderr):
            import deepspeed  # noqa: F401
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)


def import_modules(names: Iterable[str], packages: Iterable[str] = ()) -> None:
    """Import ``names`` and every module of ``packages``.

    A library that is not installed is skipped: the plan that needs it will say so. The
    standalone scripts (tools/smoke/scripts/) are a plain folder, not a package, so the walk
    never reaches them: they are scripts, not libraries.
    """
    for name in names:
        try:
            if name == "deepspeed":
                import_deepspeed_quietly()
            else:
                importlib.import_module(name)
        except ImportError:
            continue
    for package in packages:
        pkg = importlib.import_module(package)
        for info in pkgutil.walk_packages(pkg.__path__, f"{package}."):
            importlib.import_module(info.name)


def warm_up(packages: Iterable[str] = ()) -> None:
    """Import ``LAZY_IMPORTS`` and the ``tools`` package once per process, then ``packages``.

    Later calls return at once, except for importing ``packages`` (already-imported modules
    cost a dictionary lookup). Intake does not call it: a chat's clarifying question should not
    wait for DeepSpeed.
    """
    global _warmed
    if not _warmed:
        with _LOCK:
            if not _warmed:
                import_modules(LAZY_IMPORTS, packages=("tools",))
                _warmed = True
    import_modules((), packages=packages)
