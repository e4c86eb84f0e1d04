"""A chat follow-up that changes fields names the wishes it cannot carry.

Before, "make it 2 A100 in JAX by Friday" re-planned on two A100s and dropped "JAX" and
"by Friday" without a word.
"""

from __future__ import annotations

from pathlib import Path

from inproc import run_main


def test_a_changing_follow_up_names_the_wishes_it_does_not_carry(tmp_path: Path) -> None:
    script = "fine-tune gpt2 on 1 A100\nmake it 2 A100 in JAX by Friday\n/quit\n"
    done = run_main("chat", "--no-smoke", "--thread", "fu-1", cwd=tmp_path, stdin=script)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    changed = next(i for i, x in enumerate(lines) if x.startswith("follow-up: hardware"))
    assert lines[changed + 1].startswith("not carried: 'JAX', 'by Friday': ")
    assert any(x.startswith("plan: gpt2 on 1x2xA100-80GB") for x in lines[changed:])
