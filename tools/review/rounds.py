"""The review's rounds: the verdict, and the record of what each round failed on and changed."""

from __future__ import annotations

from typing import Any, Literal

from tools.core.schemas import Finding, MemoryPlan, Review


def decide(
    findings: list[Finding],
    round_no: int,
    max_rounds: int,
    setup: dict[str, str] | None = None,
) -> Review:
    """Approve when no error is left; otherwise ask for changes until the rounds run out.

    ``setup`` is what this round judged (``setup_of``), kept on the review for the next round.
    """
    errors = [f for f in findings if f.severity == "error"]
    if not errors:
        verdict: Literal["approved", "changes_requested", "rejected"] = "approved"
    elif round_no < max_rounds:
        verdict = "changes_requested"
    else:
        verdict = "rejected"
        findings = [
            *findings,
            Finding(
                severity="error",
                check="verdict",
                message=f"rejected after {round_no} of at most {max_rounds} review round(s); "
                f"still failing: {', '.join(dict.fromkeys(failure_label(f) for f in errors))}",
                fix="the engineer's changes did not resolve it within max_review_rounds: apply the "
                "fixes above by hand, change the brief (more or larger GPUs, a smaller model or "
                "sequence), or allow more rounds",
            ),
        ]
    return Review(verdict=verdict, rounds=round_no, findings=findings, setup=setup or {})


def failure_label(finding: Finding) -> str:
    """A short name for an error finding: its check, and for a failed smoke run its kind."""
    if finding.check == "smoke_verdict":
        return f"smoke {finding.failure_kind}" if finding.failure_kind else "smoke run"
    return finding.check or finding.message


def setup_of(memory: MemoryPlan | None, config: dict[str, Any] | None) -> dict[str, str]:
    """The choices a review round judged, as short strings (compared between rounds)."""
    if memory is None:
        return {}
    setup = {"strategy": memory.chosen_label}
    if config is not None:
        setup["zero_stage"] = str((config.get("zero_optimization") or {}).get("stage", 0))
    setup["micro_batch"] = str(memory.micro_batch_size)
    setup["accumulation"] = str(memory.gradient_accumulation_steps)
    setup["activation_checkpointing"] = "on" if memory.activation_checkpointing else "off"
    return setup


def round_findings(
    memory: MemoryPlan | None,
    config: dict[str, Any] | None,
    prior: Review | None,
    round_no: int,
) -> list[Finding]:
    """The review's record of the rounds: what earlier rounds failed on and what changed since.

    Each round keeps the setup it reviewed on its ``Review.setup`` (and says it in a ``setup``
    finding for people). The next round compares its own with it and adds one
    ``review_history`` line,
    e.g. ``round 1: smoke oom -> round 2: strategy zero2 (was zero1), zero_stage 2 (was 1)``;
    lines of earlier rounds are carried forward, so the final review holds the whole story.
    """
    setup = setup_of(memory, config)
    findings: list[Finding] = []
    if prior is not None and prior.verdict == "changes_requested" and prior.rounds == round_no - 1:
        findings += [f for f in prior.findings if f.check == "review_history"]
        before = prior.setup
        failed = [failure_label(f) for f in prior.findings if f.severity == "error"]
        changes = [f"{k} {v} (was {before[k]})" for k, v in setup.items() if before.get(k, v) != v]
        findings.append(
            Finding(
                severity="info",
                check="review_history",
                message=f"round {prior.rounds}: {', '.join(dict.fromkeys(failed)) or 'changes requested'}"
                f" -> round {round_no}: {', '.join(changes) or 'no change to the setup'}",
            )
        )
    if setup:
        findings.append(
            Finding(
                severity="info",
                check="setup",
                message="reviewed " + " ".join(f"{k}={v}" for k, v in setup.items()),
            )
        )
    return findings
