"""One plan's typed facts while a node works on it: rebuilt from the graph state, read by the tools."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tools.core.errors import InputError
from tools.core.inference_types import InferencePlan
from tools.core.paths import confined
from tools.core.schemas import (
    FrameworkChoice,
    HardwareSpec,
    LaunchSpec,
    MemoryPlan,
    ModelSpec,
    Review,
    SmokeResult,
    SpeedEstimate,
    TrainingBrief,
)
from tools.core.settings import Settings
from tools.intake.brief import brief_from_dict


class SearchRecord(BaseModel):
    """The researcher's strategy search and what it was run for (``search_inputs``).

    The engineer's plan_parallelism reuses it when the brief, hardware and model are the same,
    rather than running the same search again.
    """

    inputs: str
    plan: MemoryPlan
    # The chosen setup's speed estimate, which the plan carries but does not dump.
    speed: SpeedEstimate | None = None

    def reused(self) -> MemoryPlan:
        """The recorded plan, its speed estimate attached again."""
        return self.plan.model_copy(update={"speed": self.speed})


def search_inputs(brief: TrainingBrief, hardware: HardwareSpec, model: ModelSpec) -> str:
    """A digest of what a search depends on: the brief, the hardware and the model."""
    h = hashlib.sha256()
    for part in (brief, hardware, model):
        h.update(part.model_dump_json().encode())
    return h.hexdigest()


@dataclass
class Workspace:
    """What one plan's tools read and write; never shown to the model as arguments."""

    settings: Settings
    out_dir: Path
    brief: TrainingBrief
    hardware: HardwareSpec | None = None
    model: ModelSpec | None = None
    framework: FrameworkChoice | None = None
    memory: MemoryPlan | None = None
    speed: SpeedEstimate | None = None
    deepspeed_config: dict[str, Any] | None = None
    config_validated: bool = False
    launch: LaunchSpec | None = None
    smoke: SmokeResult | None = None
    review: Review | None = None
    inference: InferencePlan | None = None
    round_no: int = 1
    on_progress: Callable[[str], None] | None = None
    notes: list[str] = field(default_factory=list)
    # The review this node started from (the previous round's), kept when a node clears
    # ``review`` to start a new one: the reviewer compares rounds with it.
    prior_review: Review | None = None
    # Smoke runs made through this workspace (the injected-fault testing aid counts them).
    smoke_runs: int = 0
    # Why the global batch is what it is, when the planner chose it (tools/planning/batch.py).
    batch_note: str | None = None
    # The researcher's search (for the framework choice), which the engineer reuses.
    searched: SearchRecord | None = None
    # Why an fp8 recipe trains bf16 here: no launch that applies it (tools/artifacts/fp8_launch.py).
    precision_note: str | None = None
    # Why the brief's recipe framework is not what memory is priced for: it has no launch here
    # (tools/intake/recipe_framework.py).
    recipe_note: str | None = None

    def __post_init__(self) -> None:
        """Remember the review the workspace was built with."""
        if self.prior_review is None:
            self.prior_review = self.review

    @property
    def first_round(self) -> bool:
        """Whether this plan is in its first engineering round (no changes were requested)."""
        return self.prior_review is None or self.prior_review.verdict != "changes_requested"

    def settle_batch(self) -> None:
        """Fill in the default global batch once the model and hardware are known (none given).

        The recipe's framework first becomes the launch's when the brief names none
        (``settle_recipe``), then the precision (``settle_precision``), which needs the same two.
        """
        self.settle_recipe()
        if self.brief.global_batch_size is None and self.model and self.hardware:
            from tools.planning.batch import resolve_batch

            self.brief, self.batch_note = resolve_batch(self.brief, self.model, self.hardware)
        if self.brief.global_batch_size is not None:
            from tools.planning.batch import resolve_steps

            self.brief, steps = resolve_steps(self.brief)
            self.batch_note = "; ".join(n for n in (self.batch_note, steps) if n) or None
        self.settle_precision()

    def settle_recipe(self) -> None:
        """Plan on the launch the recipe's framework prices (the numbers and the launch agree).

        Deterministic in the brief, so every node settles the same brief; a second settle
        changes nothing and keeps the line.
        """
        from tools.intake.recipe_fields import settle_recipe_fields
        from tools.intake.recipe_framework import settle_recipe

        self.brief, note = settle_recipe(self.brief)
        self.brief, fields = settle_recipe_fields(self.brief)
        said = "; ".join(line for line in (note, fields) if line)
        self.recipe_note = said or self.recipe_note

    def settle_precision(self) -> None:
        """Put an fp8 recipe on a launcher that applies it, else train bf16 and say why.

        Deterministic in the brief and the model, like the batch, so every node settles the
        same brief. A GPU without FP8 tensor cores is left to the planner, which refuses fp8
        there in one line (exit 2).
        """
        recipe, gpu = self.brief.recipe, self.hardware.gpu if self.hardware else None
        if recipe is None or self.model is None or gpu is None or not gpu.fp8_tflops:
            return
        from tools.artifacts.fp8_launch import fp8_launch

        launch = fp8_launch(self.brief, self.model)
        if launch is None:
            return
        if launch.framework is None:
            self.brief = self.brief.model_copy(
                update={"recipe": recipe.model_copy(update={"precision": "bf16"})}
            )
            self.precision_note = launch.note
        elif recipe.framework != launch.framework:
            self.brief = self.brief.model_copy(
                update={"recipe": recipe.model_copy(update={"framework": launch.framework})}
            )

    def settle_setup_precision(self) -> None:
        """Train bf16 where the searched setup's Megatron launch would not apply the fp8 recipe.

        Deterministic in the brief, the model and the memory plan (tools/artifacts/fp8_launch.py
        ``setup_refusal``), so every node after the engineer's search settles the same brief,
        the same line and the same framework rationale.
        """
        if self.memory is None or self.model is None:
            return
        from tools.artifacts.fp8_launch import setup_refusal
        from tools.research.fp8_framework import fp8_dropped

        why, recipe = setup_refusal(self.brief, self.model, self.memory), self.brief.recipe
        if why is None or recipe is None:
            return
        self.brief = self.brief.model_copy(
            update={"recipe": recipe.model_copy(update={"precision": "bf16"})}
        )
        self.precision_note = why
        if self.framework is not None:
            self.framework = fp8_dropped(self.framework)

    def progress(self, text: str) -> None:
        """Report progress to whoever is watching (CLI, REPL)."""
        if self.on_progress:
            self.on_progress(text)


# The state keys of a plan's work products and their types (graphs/state.py PlanState).
PRODUCTS: dict[str, type[BaseModel]] = {
    "hardware": HardwareSpec,
    "model": ModelSpec,
    "framework": FrameworkChoice,
    "memory": MemoryPlan,
    "speed": SpeedEstimate,
    "launch": LaunchSpec,
    "smoke_test": SmokeResult,
    "review": Review,
    "inference": InferencePlan,
    "searched": SearchRecord,
}


def from_state(
    state: Mapping[str, Any], settings: Settings, on_progress: Callable[[str], None] | None = None
) -> Workspace:
    """Rebuild the typed workspace from the graph state (state holds plain JSON-able dicts)."""

    def typed(key: str) -> Any:
        value = state.get(key)
        return PRODUCTS[key].model_validate(value) if value is not None else None

    ws = Workspace(
        settings=settings,
        out_dir=_out_dir(state, settings),
        brief=brief_from_dict(state["brief"]),
        hardware=typed("hardware"),
        model=typed("model"),
        framework=typed("framework"),
        memory=typed("memory"),
        deepspeed_config=state.get("deepspeed_config"),
        speed=typed("speed"),
        launch=typed("launch"),
        smoke=typed("smoke_test"),
        review=typed("review"),
        inference=typed("inference"),
        searched=typed("searched"),
        round_no=int(state.get("review_round", 0)) or 1,
        on_progress=on_progress,
    )
    ws.settle_batch()
    ws.settle_setup_precision()
    return ws


def _out_dir(state: Mapping[str, Any], settings: Settings) -> Path:
    """The state's output folder; served, it must stay inside the root (a client can edit state)."""
    chosen = state.get("out_dir")
    if settings.serve_root is None:
        return Path(chosen or settings.out_dir)
    return confined(settings.serve_root, str(chosen or "."), absolute_inside=True)


# Every work product a plan's nodes write, by state key: a fresh request clears them all, and
# the reporter replaces them with the assembled plan.
PRODUCT_KEYS = (*PRODUCTS, "deepspeed_config")
# Workspace attributes whose name differs from their state key.
_ATTRIBUTE = {"smoke_test": "smoke", "review_round": "round_no"}


def to_state(ws: Workspace, keys: tuple[str, ...]) -> dict[str, Any]:
    """The workspace's values for ``keys`` as the graph state keeps them (JSON-able)."""
    update: dict[str, Any] = {}
    for key in keys:
        value = getattr(ws, _ATTRIBUTE.get(key, key))
        update[key] = dump(value) if isinstance(value, BaseModel) else value
    return update


def dump(obj: BaseModel | None) -> Any:
    """A work product as the graph state keeps it: JSON-able, or None."""
    return obj.model_dump(mode="json") if obj is not None else None


def need(value: Any, what: str, tool: str) -> Any:
    """``value``, or the tool-call error that says which tool must run first."""
    if value is None:
        raise InputError("", f"{what} is not known yet; call {tool} first")
    return value
