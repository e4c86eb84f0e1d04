"""Run the CLI's ``main(argv)`` in this process and answer as ``subprocess.run`` would.

Most exit-code and message tests need the CLI's answer, not a process: a subprocess pays the
interpreter's and the imports' cold start (4-5 s) for one line. ``run_main`` calls
``app.main`` with the test's environment (the conftest's isolated home, output and knowledge
paths), in ``cwd``, with stdin, stdout and stderr captured, and gives back a
``CompletedProcess`` (returncode, stdout, stderr). argparse's ``SystemExit`` becomes the exit
code; the signal handlers the CLI installs for its own process are put back afterwards.
Tests of what needs a real process (signals, Ctrl-C, cold start, a clean stdout stream) keep
starting ``python app.py``: see procs.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from pathlib import Path


def run_main(
    *args: str | Path, cwd: Path | str | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """``python app.py ARGS`` in process: the exit code and what it wrote to stdout and stderr."""
    import app

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    before, stdin_before = os.getcwd(), sys.stdin
    out, err = io.StringIO(), io.StringIO()
    sys.stdin = io.StringIO(stdin)
    if cwd is not None:
        os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = app.main([str(a) for a in args])
            except SystemExit as exc:  # argparse: --help, a bad flag
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(before)
        sys.stdin = stdin_before
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(
        ["app.py", *map(str, args)], code, out.getvalue(), err.getvalue()
    )
