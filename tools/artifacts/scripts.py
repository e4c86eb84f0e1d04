"""Text for the launch files: shell quoting, one-line comments, and the templates under templates/.

The templates (guides, ``launch.sh``, ``train.sbatch``, the Accelerate header) are package data,
read with importlib.resources so an installed wheel finds them too. They are
``string.Template`` text: ``$name`` is a placeholder and ``$$`` a literal ``$`` (the shell
scripts need many). A template ends with a newline; a placeholder that stands for a block of
lines gets the block without its last newline.
"""

from __future__ import annotations

import shlex
import string
from functools import cache
from importlib import resources


class Shell(str):
    """An argument written into a script as shell text (``"$SLURM_NODEID"``), not quoted."""

    __slots__ = ()


def shell_join(argv: list[str]) -> str:
    """Quote an argument list for a script; ``Shell`` arguments go in verbatim."""
    return " ".join(arg if isinstance(arg, Shell) else shell_quote(arg) for arg in argv)


def shell_quote(arg: str) -> str:
    r"""``arg`` as one word that bash reads back exactly, whatever it holds, on one line.

    ``shlex.quote``, except that text with a control character (a newline, a tab, ...) is
    written in bash's ``$'...'`` form with each such character as ``\xHH`` bytes, so a
    command never spans lines.
    """
    if all(c.isprintable() for c in arg):
        return shlex.quote(arg)
    out = []
    for c in arg:
        if c in "\\'":
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            out.append("".join(f"\\x{b:02x}" for b in c.encode("utf-8", "surrogateescape")))
    return "$'" + "".join(out) + "'"


def comment_text(text: str) -> str:
    """``text`` as one line for a ``#`` comment in a script.

    A newline (or any other control character) in a brief's goal or a model's name would end
    the comment, and the rest would run as a command.
    """
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


@cache
def _template(name: str) -> string.Template:
    path = resources.files("tools.artifacts").joinpath("templates", name)
    return string.Template(path.read_text(encoding="utf-8"))


def render(name: str, **values: object) -> str:
    """The template ``templates/<name>`` with every placeholder filled from ``values``.

    ``substitute``, not ``safe_substitute``: a placeholder left without a value is our bug and
    raises here instead of reaching a user's script. Values are inserted as they are and never
    scanned again, so a ``$`` in a goal or a model's name stays literal text.
    """
    return _template(name).substitute(values)
