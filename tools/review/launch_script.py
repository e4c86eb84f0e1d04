"""Reading a launch script as bash would: whether one of its lines runs the plan's command."""

from __future__ import annotations

import re
import shlex


def runs_command(script: str, command: list[str]) -> bool:
    """Whether a line of the script is the command, as the shell splits it.

    An argument written as shell text (``"$MEGATRON_DIR/pretrain_gpt.py"``,
    tools/artifacts/scripts.py ``Shell``) is compared as the shell reads its quotes.
    """
    if shlex.join(command) in script:
        return True
    wanted = [shlex.split(a)[0] if a.startswith('"$') else a for a in command]
    defaults = _script_defaults(script)
    for line in script.splitlines():
        try:
            if _unset_expansions(shlex.split(line), defaults) == wanted:
                return True
        except ValueError:
            continue
    return False


def command_argv(script: str, program: str) -> list[str] | None:
    """The arguments of the script's first line that runs ``program``, as bash reads them.

    From ``program`` on (an ``srun ... deepspeed ...`` line of train.sbatch gives the
    ``deepspeed ...`` part, also inside ``srun bash -c '...'``), without a trailing ``&``, with the script's overridable variables
    at their defaults and ``"$@"`` and ``${DATA:+...}`` unset; None when no line runs it.
    """
    defaults = _script_defaults(script)
    for line in script.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if program in words:
            argv = _unset_expansions(words[words.index(program) :], defaults)
            return argv[:-1] if argv and argv[-1] == "&" else argv
        if "-c" in words[:-1]:  # srun bash -c 'exec deepspeed ...' (a multi-node sbatch)
            inner = command_argv(words[words.index("-c") + 1], program)
            if inner is not None:
                return inner
    return None


_DEFAULTED = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*:-(.*)\}$")
# ``[[ -n "${NAME:-}" ]] || NAME=VALUE``: the script's value for NAME when it is unset.
_FALLBACK = re.compile(
    r'^\[\[ -n "\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*):-\}" \]\] \|\| (?P=name)=(?P<value>.+)$'
)


def _script_defaults(script: str) -> dict[str, str]:
    """The values the script gives its overridable variables (``$MODEL_PATH``) when unset."""
    defaults = {}
    for line in script.splitlines():
        match = _FALLBACK.match(line)
        if match:
            try:
                defaults[match["name"]] = _shell_word(match["value"])
            except ValueError:
                continue
    return defaults


def _shell_word(text: str) -> str:
    r"""One shell word as bash reads it: ``shlex`` quoting, or ``$'...'`` with ``\xHH`` escapes."""
    if not (text.startswith("$'") and text.endswith("'")):
        (word,) = shlex.split(text)
        return word
    raw = bytearray()
    for match in re.finditer(r"\\x([0-9a-fA-F]{2})|\\(.)|(.)", text[2:-1], flags=re.DOTALL):
        hex_byte, escaped, plain = match.groups()
        raw += bytes([int(hex_byte, 16)]) if hex_byte else (escaped or plain).encode()
    return raw.decode("utf-8", "surrogateescape")


def _unset_expansions(argv: list[str], defaults: dict[str, str] | None = None) -> list[str]:
    """A script line as it runs with its environment overrides unset and no arguments.

    train.py launches read ``"$MODEL_PATH"`` (the script's ``defaults``, the plan's weights),
    add ``${DATA:+--data}`` and pass ``"$@"`` on (tools/artifacts/launch.py ``job_command``):
    unset, those are the plan's own command.
    """
    defaults = defaults or {}
    out = []
    for arg in argv:
        if arg == "$@" or (arg.startswith("${") and ":+" in arg):
            continue
        if arg.startswith("$") and arg[1:] in defaults:
            out.append(defaults[arg[1:]])
            continue
        match = _DEFAULTED.match(arg)
        # shlex keeps the backslash of \$ and \` inside double quotes; bash drops it.
        out.append(re.sub(r"\\([$`])", r"\1", match[1]) if match else arg)
    return out
