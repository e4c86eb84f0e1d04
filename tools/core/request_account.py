"""The request's accounting (plan JSON ``request``): what was read, assumed, wished, not understood.

Intake fills it (tools/intake/account.py) from the words of the request or the fields of a
brief; the planner, the reviewer and the reporter mark each wish honoured or refused by name
(``mark_wish``). Nothing is silent: every fact of a plan that the request gave has its quote,
every default intake applied has its why, every number intake could not bind is listed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

# What a wish says before the planner has decided it.
UNDECIDED = "to be decided by the planner"


class ReadFact(BaseModel):
    """A brief field the request stated: its value and the words it came from."""

    field: str
    value: Any
    quote: str


class AssumedFact(BaseModel):
    """A brief field the request left open: the value intake (or the planner) takes, and why."""

    field: str
    value: Any
    why: str


class Wish(BaseModel):
    """Something the request asked for by name: honoured (True), refused (False) or undecided."""

    wish: str  # a stable id: framework:pytorch_fsdp, avoid:deepspeed, objective:rl, ...
    quote: str
    honoured: bool | None = None
    how: str = UNDECIDED


class RequestAccount(BaseModel):
    """Every word of the request accounted for (plan JSON ``request``)."""

    text: str = ""
    read: list[ReadFact] = Field(default_factory=list)
    assumed: list[AssumedFact] = Field(default_factory=list)
    wishes: list[Wish] = Field(default_factory=list)
    not_understood: list[str] = Field(default_factory=list)

    def wish(self, name: str) -> Wish | None:
        """The wish named ``name`` (its id), or None."""
        return next((w for w in self.wishes if w.wish == name), None)

    def undecided(self) -> list[Wish]:
        """The wishes nobody has honoured or refused yet."""
        return [w for w in self.wishes if w.honoured is None]


def mark_wish(
    account: RequestAccount | dict[str, Any] | None, name: str, honoured: bool, how: str
) -> dict[str, Any] | None:
    """Mark the wish ``name`` honoured (True) or refused (False) and say how; the account as a dict.

    For the planner, the reviewer and the reporter: ``account`` is the graph state's
    ``request_account`` (a dict) or a ``RequestAccount``; the result is a new dict (the
    input is not changed), or None when there is no account. A name the request did not
    wish for changes nothing. ``name`` may end in ``*`` to mark every wish with that prefix
    (``avoid:*``).
    """
    if account is None:
        return None
    acc = (
        account.model_copy(deep=True)
        if isinstance(account, RequestAccount)
        else RequestAccount.model_validate(account)
    )
    prefix = name[:-1] if name.endswith("*") else None
    for w in acc.wishes:
        if w.wish == name or (prefix is not None and w.wish.startswith(prefix)):
            w.honoured, w.how = honoured, how
    return acc.model_dump(mode="json")


# How the plan treats the objective a request names (tools/artifacts/headline.py says the same in
# the headline): (honoured, how).
OBJECTIVE_MARKS: dict[str, tuple[bool, str]] = {
    "sft": (True, "planned: a supervised fine-tune"),
    "continued-pretraining": (
        True,
        "planned: pretraining that starts from the model's weights (the job loads them)",
    ),
    "rl": (
        False,
        "not planned: RL with rollouts and reward models is not planned; the plan is the "
        "policy's supervised fine-tune (the headline names the tools that do RL)",
    ),
    "dpo": (
        False,
        "partly: the plan sizes the policy's training, and its launch files train the "
        "next-token loss, not the DPO loss; the reference model is not in the memory estimate "
        "(the headline says so and names what runs DPO)",
    ),
    "distill": (
        False,
        "partly: the plan sizes the student's training, and its launch files train the "
        "next-token loss, not the distillation loss; the teacher model is not in the memory "
        "estimate (the headline says so)",
    ),
}


# Preference objectives with no reference model, read as DPO ("objective:dpo"): their name and
# what runs them (TRL's ORPOTrainer; SimPO is TRL's CPOTrainer with loss_type="simpo").
REFERENCE_FREE = {
    "orpo": ("ORPO", "TRL's ORPOTrainer"),
    "simpo": ("SimPO", "TRL's CPOTrainer (loss_type='simpo')"),
}


def reference_free(quote: str) -> tuple[str, str] | None:
    """(name, what runs it) when a DPO-family wish's words name a reference-free method."""
    return REFERENCE_FREE.get(quote.strip().lower())


# What an undecided wish says in a finished plan: nobody acted on it, and the plan says so.
NOT_CHECKED = "not checked: no planning step acts on this wish yet; the plan does not promise it"


def closed_account(
    account: RequestAccount | dict[str, Any] | None,
    used_frameworks: list[str] | None = None,
    zero_stage: int | None = None,
    *,
    primary: str | None = None,
    not_honoured: str | None = None,
    objective: str | None = None,
) -> RequestAccount:
    """The account as a finished plan carries it: every wish still undecided says it was not checked.

    The reporter calls this last, after the planner and the reviewer marked what they decided
    (``mark_wish``); ``honoured`` stays null for those, and ``how`` says so out loud.
    ``used_frameworks`` are the frameworks the finished plan uses (its stack, and deepspeed
    when it writes a DeepSpeed config): a refused one there is marked refused, whatever was
    said before, so the account never claims a refusal the plan did not keep. ``zero_stage``
    is the chosen setup's ZeRO stage (None: no training setup): a refused stage ("do not use
    ZeRO-3", ``avoid:zero-3``) is kept or not by it. ``primary`` is the framework the plan
    runs on (a ``framework:X`` wish is honoured when it is X, else refused with
    ``not_honoured``, the planner's reason); ``objective`` is the brief's (its wish is marked as
    ``OBJECTIVE_MARKS`` says: RL is not planned, continued pretraining loads the weights).
    """
    if account is None:
        return RequestAccount()
    acc = (
        account.model_copy(deep=True)
        if isinstance(account, RequestAccount)
        else RequestAccount.model_validate(account)
    )
    used = set(used_frameworks or ())
    # The first framework named is the brief's wish, whose reason the planner gave; a later one
    # ("with fsdp, with megatron") is not used because the first was taken.
    first = next((w.wish for w in acc.wishes if w.wish.startswith("framework:")), None)
    for w in acc.wishes:
        kind, _, name = w.wish.partition(":")
        if kind == "framework" and primary is not None:
            w.honoured = name == primary or name in used
            why = not_honoured if w.wish == first else None
            if w.wish != first and first is not None:
                why = (
                    f"the plan runs on {primary}: of the frameworks named, the first "
                    f"({first.partition(':')[2]}) is the wish planned for"
                )
            w.how = (
                f"used: the plan runs on {primary}"
                if w.honoured
                else f"not used: {why or f'the plan runs on {primary}'}"
            )
        elif kind == "objective" and objective is not None and name in OBJECTIVE_MARKS:
            w.honoured, w.how = OBJECTIVE_MARKS[name]
            if name == "dpo" and (method := reference_free(w.quote)) is not None:
                w.how = (
                    "partly: the plan sizes the policy's training, and its launch files train the "
                    f"next-token loss, not {method[0]}'s loss ({method[0]} needs no reference "
                    f"model; {method[1]} runs it)"
                )
        if kind == "avoid" and name in used:
            w.honoured = False
            w.how = f"not kept: the plan still uses {name} (its framework stack or config)"
        elif kind == "avoid" and name.startswith("zero-") and zero_stage is not None:
            kept = name != f"zero-{zero_stage}"
            w.honoured = kept
            w.how = (
                f"{'not used' if kept else 'not kept'}: the chosen setup is ZeRO stage {zero_stage}"
            )
    for w in acc.undecided():
        if w.how == UNDECIDED:
            w.how = NOT_CHECKED
    return acc
