"""One chooser, run once: the engineer reuses the researcher's search unless the brief changed.

The researcher searches to choose the framework (agents/toolkit.py select_framework); the
engineer's plan_parallelism used to run that same search again, and a replicating framework's
DDP plan was chosen outside the search (agents/toolkit.py ``_replicated``). Now the
replicating framework is a search option, and ``search_strategy(..., searched=...)`` reuses
the researcher's result. The searches are counted at ``tools.planning.search.run_search``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tools.planning.search as search
from agents.toolkit import engineer_tools, researcher_tools
from agents.workspace import Workspace, from_state, to_state
from tools.core.settings import Settings
from tools.intake.brief import brief_from_dict

# Llama 3 8B does not fit DDP on 8 A100s: a DeepSpeed plan.
BRIEF = {
    "model": "llama-3-8b",
    "hardware": "1x8xA100-80GB",
    "seq_len": 4096,
    "global_batch_size": 64,
    "task": "finetune",
    "smoke": False,
}


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The options of every search run, in order."""
    seen: list[Any] = []
    real = search.run_search

    def counted(model: Any, hardware: Any, brief: Any, options: Any) -> Any:
        seen.append(options)
        return real(model, hardware, brief, options)

    monkeypatch.setattr(search, "run_search", counted)
    return seen


def _researched(tmp_path: Path, settings: Settings, **brief: Any) -> Workspace:
    ws = Workspace(settings=settings, out_dir=tmp_path, brief=brief_from_dict({**BRIEF, **brief}))
    tools = {t.name: t for t in researcher_tools(ws)}
    tools["profile_hardware"].invoke({"spec": ws.brief.hardware})
    tools["lookup_model"].invoke({"model": ws.brief.model, "seq_len": ws.brief.seq_len})
    tools["select_framework"].invoke({})
    return ws


def _plan(ws: Workspace, **args: Any) -> None:
    next(t for t in engineer_tools(ws) if t.name == "plan_parallelism").invoke(args)


def test_the_engineer_reuses_the_researchers_search(
    tmp_path: Path, settings: Settings, searches: list[Any]
) -> None:
    ws = _researched(tmp_path, settings)
    assert ws.framework is not None and ws.framework.primary == "deepspeed"
    assert len(searches) == 1 and ws.searched is not None
    _plan(ws)
    assert len(searches) == 1  # not searched again
    assert ws.memory is not None and ws.memory.chosen_label == ws.searched.plan.chosen_label
    # A changed request (here: a micro-batch the review asked for) is a new search.
    _plan(ws, micro_batch_size=1)
    assert len(searches) == 2 and searches[-1].micro_batch_size == 1


def test_the_record_survives_the_graph_state_between_the_roles(
    tmp_path: Path, settings: Settings, searches: list[Any]
) -> None:
    ws = _researched(tmp_path, settings)
    state = {"brief": BRIEF, **to_state(ws, ("hardware", "model", "framework", "searched"))}
    engineer = from_state(state, settings)
    _plan(engineer)
    assert len(searches) == 1
    # The speed estimate, which a plan does not dump, comes along (the report's scaling needs it).
    assert engineer.memory is not None and engineer.memory.speed is not None
    assert ws.searched is not None and engineer.memory.speed == ws.searched.plan.speed
    assert engineer.speed == engineer.memory.speed


def test_a_changed_brief_searches_again(
    tmp_path: Path, settings: Settings, searches: list[Any]
) -> None:
    ws = _researched(tmp_path, settings)
    ws.brief = ws.brief.model_copy(update={"global_batch_size": 128})
    _plan(ws)
    assert len(searches) == 2
    assert ws.memory is not None and ws.memory.setup is not None
    setup = ws.memory.setup
    assert setup.micro_batch_size * setup.gradient_accumulation_steps * setup.data_parallel == 128


def test_a_replicating_framework_is_a_search_option(
    tmp_path: Path, settings: Settings, searches: list[Any]
) -> None:
    """Llama 3.2 3B fits DDP on 8 A100s: the framework choice is PyTorch DDP."""
    ws = _researched(tmp_path, settings, model="llama-3.2-3b")
    fastest = ws.searched.plan if ws.searched else None
    assert fastest is not None and fastest.chosen == "zero1"  # DDP fits, ZeRO-1 is faster
    assert ws.framework is not None and ws.framework.primary == "pytorch_ddp"
    _plan(ws)
    # The researcher's search is reused; only the DDP-only search is new.
    assert len(searches) == 2 and list(searches[-1].strategies) == ["ddp"]
    assert ws.memory is not None and ws.memory.chosen_label == "ddp"
    assert "pytorch_ddp replicates the model on every GPU" in ws.memory.assumptions[0]
    assert "(zero1, on DeepSpeed)" in ws.memory.assumptions[0]
