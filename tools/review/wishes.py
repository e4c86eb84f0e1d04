"""The reviewer's check that the plan honours the request's framework wishes, files included.

A framework the brief refuses (``avoid_frameworks``) must not be the plan's framework, be in its
stack, or show in what the plan emitted (ds_config.json or a ``deepspeed`` launch for DeepSpeed,
``pretrain_gpt.py`` for Megatron, ``torchtitan.toml`` for torchtitan). A framework the brief
names (``framework``) is the plan's, or the plan says why not (``framework.not_honoured``, which
the report's headline shows); and the emitted files run on the plan's own stack.
"""

from __future__ import annotations

from typing import Any

from tools.core.schemas import Finding, FrameworkChoice, LaunchSpec, TrainingBrief
from tools.research.splits import refused_in

_FIX = (
    "plan again with the brief's framework wishes: the search offers no setup on a refused "
    "framework (tools/research/splits.py runs_setup), and the launch files follow the framework"
)


def emitted_frameworks(
    deepspeed_config: dict[str, Any] | None, launch: LaunchSpec | None
) -> set[str]:
    """The frameworks the plan's emitted files run on, read from the files and the command."""
    found: set[str] = set()
    files = launch.files if launch is not None else {}
    command = launch.command if launch is not None else []
    if deepspeed_config is not None or "ds_config.json" in files or command[:1] == ["deepspeed"]:
        found.add("deepspeed")
    if (
        any(arg.rstrip('"').endswith("pretrain_gpt.py") for arg in command)
        or "MEGATRON.md" in files
    ):
        found.add("megatron")
    if "torchtitan.toml" in files:
        found.add("torchtitan")
    return found


def check_wishes(
    brief: TrainingBrief,
    framework: FrameworkChoice,
    deepspeed_config: dict[str, Any] | None,
    launch: LaunchSpec | None,
) -> list[Finding]:
    """The plan's framework and emitted files against the brief's framework and refusals."""
    if brief.task in ("agent-app", "inference"):
        return []
    problems: list[str] = []
    on_stack = {framework.primary, *framework.stack}
    refused = sorted(
        set(refused_in(framework.primary, brief.avoid_frameworks))
        | (set(brief.avoid_frameworks) & (on_stack - {"pytorch"}))
    )
    if refused:
        problems.append(
            f"the plan runs on {framework.primary} (stack {', '.join(framework.stack)}), which "
            f"uses {', '.join(refused)}, refused by the brief's avoid_frameworks"
        )
    emitted = emitted_frameworks(deepspeed_config, launch)
    if bad := sorted(emitted & set(brief.avoid_frameworks)):
        problems.append(f"the emitted files run {', '.join(bad)}, refused by the brief")
    if stray := sorted(emitted - on_stack):
        problems.append(
            f"the emitted files run {', '.join(stray)}, not the plan's {framework.primary}"
        )
    wished = brief.framework
    if wished is not None and framework.primary != wished:
        if not framework.not_honoured:
            problems.append(
                f"the brief asks for {wished} but the plan runs on {framework.primary} "
                "without saying why"
            )
        if f"The framework is {wished}, as the request asks." in framework.rationale:
            problems.append(
                f"the rationale says the framework is {wished}, as the request asks, but the "
                f"plan runs on {framework.primary}"
            )
    if problems:
        return [Finding(severity="error", check="wishes", message="; ".join(problems), fix=_FIX)]
    said = f": {framework.not_honoured}" if framework.not_honoured else ""
    return [
        Finding(
            severity="info",
            check="wishes",
            message=f"the plan runs on {framework.primary}"
            + (", as the brief asks" if wished == framework.primary else "")
            + (
                f", and nothing of {', '.join(brief.avoid_frameworks)}"
                if brief.avoid_frameworks
                else ""
            )
            + said,
        )
    ]
