"""The wheel holds every tracked package file, and the README's adapter snippets run from it.

``test_wheel_holds_every_tracked_package_file`` builds the wheel from a copy of the files git
tracks (so the repository gets no ``build/`` or ``*.egg-info``, and an untracked stray file
cannot get in) and checks that every tracked file under ``agents``, ``graphs``, ``tools``,
``knowledge`` and ``prompts``, and ``app.py``, is in it, and nothing else: a new sub-package
without ``__init__.py`` or a data file that ``package-data`` does not match fails here.

``test_readme_adapters_run_from_the_installed_wheel`` installs that wheel into a fresh venv
and runs the README's three adapter snippets there, offline, from a folder outside the
repository. Why this stands for "a fresh venv with the lock, then the wheel":

- The running interpreter's venv holds the lock: ``make`` installs ``requirements.lock`` into
  it in one ``pip install``, then checks ``pip check``. The fresh venv gets one ``.pth`` file
  naming that venv's site-packages, so its interpreter imports exactly those distributions:
  the same files at the same versions that installing the lock again would put there, minus
  minutes of copying (2 cores in CI).
- The fresh venv's own site-packages comes first on ``sys.path`` (a ``.pth`` line is
  appended after it), and the only thing installed into it is the wheel, with
  ``pip install --no-deps`` (before the ``.pth`` exists, so pip sees an empty venv). So
  trainwright's modules and data resolve to the wheel's copy.
- The running venv also has an editable install of the repository. A directory named by a
  ``.pth`` line is only appended to ``sys.path``; its own ``.pth`` files are not processed
  (only site directories' are), so the editable finder that would map ``tools`` to the
  repository is never installed. The test checks that, and that every trainwright module's
  ``__file__`` is under the fresh venv's site-packages.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from tools.core.settings import TELEMETRY_OFF

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("agents", "graphs", "tools", "knowledge", "prompts")
TOP_MODULES = ("app.py",)
MODULES = ("agents", "graphs", "tools", "knowledge", "prompts", "app")
BRIEF = {"model": "llama-3-8b", "hardware": "1x8xA100-80GB", "smoke": False}


def _tracked(*paths: str) -> list[str]:
    """Files git tracks under ``paths`` that exist in the work tree (posix, repo-relative)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked file list is the reference")
    res = subprocess.run(
        ["git", "ls-files", "-z", "--", *paths],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return sorted(p for p in res.stdout.split("\0") if p and (ROOT / p).is_file())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built without isolation from a copy of the tracked files."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    for rel in _tracked("."):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    dist = work / "dist"
    res = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), "."],
        cwd=src, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    [built] = dist.glob("trainwright-*.whl")
    return built


def test_wheel_holds_every_tracked_package_file(wheel: Path) -> None:
    expected = _tracked(*PACKAGE_DIRS, *TOP_MODULES)
    # The reference is not empty and covers code, data and markers alike.
    assert "tools/smoke/scripts/train.py" in expected and "knowledge/gpus.yaml" in expected
    assert "prompts/agents.yaml" in expected and "tools/py.typed" in expected
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        dist_info = [n for n in names if n.split("/")[0].endswith(".dist-info")]
        content = {n for n in names if n not in dist_info}
        entry_points = next(zf.read(n) for n in dist_info if n.endswith("/entry_points.txt"))
        metadata = next(zf.read(n) for n in dist_info if n.endswith("/METADATA")).decode()
    missing = [p for p in expected if p not in content]
    assert missing == [], f"tracked files the wheel lacks (pyproject packaging): {missing}"
    extra = sorted(content - set(expected))
    assert extra == [], f"files in the wheel that git does not track there: {extra}"
    assert b"trainwright = app:cli" in entry_points
    assert "Provides-Extra: serve" in metadata


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return Path(out.strip())


# Run in the fresh venv, from a folder outside the repository: where each module comes from,
# whether the editable finder is active, then the README's three adapter snippets.
SNIPPETS = textwrap.dedent(
    """
    import asyncio, json, sys
    import importlib.metadata as md
    import agents, app, graphs, knowledge, prompts, tools

    report = {
        "files": {m.__name__: m.__file__ for m in (agents, app, graphs, knowledge, prompts, tools)},
        "dist": str(md.distribution("trainwright").locate_file("")),
        "sys_path": sys.path,
        "editable": sorted(
            str(getattr(f, "__module__", "")) for f in sys.meta_path
            if "editable" in str(getattr(f, "__module__", "")).lower()
        ) + sorted(m for m in sys.modules if m.startswith("__editable__")),
    }
    brief = json.loads(sys.argv[1])

    from graphs.adapters.langchain_tool import make_plan_training_tool

    tool = make_plan_training_tool(out_dir="out/llama")
    report["langchain"] = json.loads(tool.invoke({"brief": brief}))

    from graphs.adapters.crewai_tool import PlanTrainingTool

    crew_tool = PlanTrainingTool(out_dir="out/crew")
    report["crewai"] = json.loads(crew_tool.run(brief=brief))

    from autogen_agentchat.messages import TextMessage
    from autogen_core import CancellationToken
    from graphs.adapters.autogen_agent import TrainingPlannerAgent

    planner = TrainingPlannerAgent(out_dir="out/ag", smoke=False)
    reply = asyncio.run(
        planner.on_messages(
            [TextMessage(content=json.dumps(brief), source="user")], CancellationToken()
        )
    )
    report["autogen_text"] = reply.chat_message.to_text()
    report["autogen"] = json.loads(report["autogen_text"].splitlines()[-1])
    print("REPORT " + json.dumps(report))
    """
)


@pytest.mark.slow
def test_readme_adapters_run_from_the_installed_wheel(
    wheel: Path, tmp_path: Path, knowledge_dir: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    new_site = _site_packages(python)
    # pip of the running venv installs into the fresh one (pip --python), from the file only.
    res = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--no-cache-dir", "--disable-pip-version-check", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (new_site / "tools" / "smoke" / "scripts" / "train.py").is_file()

    # Then the locked dependencies of the running venv become visible through one .pth file.
    locked = [p for p in site.getsitepackages() if Path(p).is_dir()]
    assert locked and all(Path(p).resolve() != new_site.resolve() for p in locked)
    (new_site / "_locked_deps.pth").write_text("".join(f"{p}\n" for p in locked))
    editable_pth = [p for d in locked for p in glob.glob(f"{d}/__editable__*trainwright*.pth")]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(TELEMETRY_OFF)
    env.update(
        TRAINWRIGHT_HOME=str(tmp_path / "home"),
        TRAINWRIGHT_OUT=str(tmp_path / "out"),
        TRAINWRIGHT_KNOWLEDGE_DIR=str(knowledge_dir),
        PYTHONDONTWRITEBYTECODE="1",
    )
    script = elsewhere / "snippets.py"
    script.write_text(SNIPPETS)
    res = subprocess.run(
        [str(python), str(script), json.dumps(BRIEF)],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-4000:]
    [line] = [ln for ln in res.stdout.splitlines() if ln.startswith("REPORT ")]
    report = json.loads(line.removeprefix("REPORT "))

    # The code that ran is the wheel's copy in the fresh venv, not the repository.
    for name, file in report["files"].items():
        assert Path(file).resolve().is_relative_to(new_site.resolve()), (name, file)
        assert not Path(file).resolve().is_relative_to(ROOT), (name, file)
    assert Path(report["dist"]).resolve() == new_site.resolve()
    # The locked set is on the path, and the repository's editable finder is not active,
    # even where the running venv has one (a .pth named by a .pth line is not processed).
    assert any(Path(p) == Path(locked[0]) for p in report["sys_path"] if p)
    assert str(ROOT) not in report["sys_path"]
    assert report["editable"] == [], report["editable"]
    if editable_pth:  # then this very interpreter runs with it: the check above can see one
        assert any(m.startswith("__editable__") for m in sys.modules)

    for key, folder in (("langchain", "llama"), ("crewai", "crew"), ("autogen", "ag")):
        summary, out = report[key], (elsewhere / "out" / folder).resolve()
        assert summary["status"] == "planned", (key, summary)
        assert summary["strategy"] in {"zero1", "zero2", "zero3"}, (key, summary)
        assert summary["review"]["verdict"] == "approved", (key, summary)
        assert summary["smoke_test"]["status"] == "skipped", (key, summary)
        # Relative out_dir, as in the README: the files land under the caller's folder.
        assert (elsewhere / summary["report"]).resolve().parent == out
        assert (out / "ds_config.json").is_file()
    assert report["autogen_text"].startswith("Plan for llama-3-8b on 1x8xA100-80GB")
