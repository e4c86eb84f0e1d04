"""The sizing's pick, its Pareto set of time against cost, and what binds when nothing meets it.

- candidates: rows that fit (or fit tight) with a speed, of the asked GPU types when the
  request names any; rows a deadline or budget rules out are not candidates.
- objective: "cheapest" (the least cost, or the least cost per token without a token budget)
  with a deadline or with neither; "fastest" (the least time) with a budget alone.
- Pareto set: the fitting, priced rows no other row beats on both time and cost per token
  (the same set whatever the token budget: both scale with it), fastest first.
- binding: when no row meets the constraints, the one that binds and by how much: nothing
  fits (memory, or the GPU cap or one node), the deadline (the fastest row's time against
  it), the budget (the cheapest row's cost against it), or both (the cheapest row within the
  deadline against the budget).
"""

from __future__ import annotations

from tools.core.schemas import SizingBinding, SizingPlan, SizingRow

DAY_S = 86_400.0


def _fitting(row: SizingRow) -> bool:
    return row.fit != "does not fit" and bool(row.tokens_per_s)


def _time_key(row: SizingRow) -> float:
    """Seconds per token: the time ranking, with or without a token budget."""
    assert row.tokens_per_s
    return 1 / row.tokens_per_s


def _cost_key(row: SizingRow) -> float:
    """Cost per token (GPU-seconds per token where there is no price, ranked after priced rows)."""
    assert row.tokens_per_s
    if row.price_per_gpu_hour is None:
        return float("inf")
    return row.count * row.price_per_gpu_hour / row.tokens_per_s


def pareto_rows(rows: list[SizingRow]) -> list[SizingRow]:
    """The fitting, priced rows no other beats on both time and cost per token, fastest first."""
    priced = sorted(
        (r for r in rows if _fitting(r) and r.price_per_gpu_hour is not None),
        key=lambda r: (_time_key(r), _cost_key(r)),
    )
    front: list[SizingRow] = []
    for row in priced:
        if not front or _cost_key(row) < _cost_key(front[-1]):
            front.append(row)
    return front


def finish_sizing(plan: SizingPlan) -> SizingPlan:
    """``plan`` with its objective, pick, Pareto set and binding (the module docstring's rules)."""
    asked = {a.gpu for a in plan.answers if a.asked}
    pool = [r for r in plan.rows if _fitting(r) and (not asked or r.gpu in asked)]
    objective = "fastest" if plan.budget_usd is not None and plan.deadline_s is None else "cheapest"
    ok = [r for r in pool if r.meets_deadline is not False and r.meets_budget is not False]
    key = _time_key if objective == "fastest" else _cost_key
    pick = min(ok, key=lambda r: (key(r), r.count)) if ok else None
    binding = None if pick is not None else _binding(plan, pool, asked)
    return plan.model_copy(
        update={
            "objective": objective,
            "pick": pick,
            "pareto": pareto_rows(plan.rows),
            "binding": binding,
        }
    )


def _binding(plan: SizingPlan, pool: list[SizingRow], asked: set[str]) -> SizingBinding:
    """What no row met, and by how much the closest row misses it."""
    kinds = ", ".join(sorted(asked)) if asked else "any GPU type sized"
    if not pool:
        cap = plan.max_gpus if not plan.one_node else None
        if plan.one_node:
            return SizingBinding(
                constraint="one_node",
                limit=1,
                text=f"one node only: nothing fits on one node of {kinds}",
            )
        if plan.max_gpus < 1024:
            return SizingBinding(
                constraint="max_gpus",
                limit=float(plan.max_gpus),
                text=f"at most {cap} GPUs: nothing fits on up to {cap} of {kinds}",
            )
        return SizingBinding(
            constraint="memory",
            limit=float(plan.max_gpus),
            text=f"GPU memory: nothing fits on up to {plan.max_gpus} of {kinds}",
        )
    deadline, budget = plan.deadline_s, plan.budget_usd
    in_time = [r for r in pool if r.meets_deadline is not False]
    if deadline is not None and not in_time:
        fastest = min(pool, key=_time_key)
        assert fastest.time_s is not None
        late = fastest.time_s - deadline
        return SizingBinding(
            constraint="deadline",
            limit=deadline,
            best=fastest.time_s,
            by=late,
            text=(
                f"the deadline of {deadline / DAY_S:g} days: the fastest, {fastest.count} x "
                f"{fastest.gpu} ({fastest.setup}), takes {fastest.time_s / DAY_S:.1f} days, "
                f"{late / DAY_S:.1f} days ({late / deadline:.0%}) over"
            ),
        )
    assert budget is not None
    priced = [r for r in in_time if r.cost_usd is not None]
    if not priced:
        return SizingBinding(
            constraint="budget",
            limit=budget,
            text=f"the budget of ${budget:,.0f}: no row has a price (give one per GPU type)",
        )
    cheapest = min(priced, key=lambda r: r.cost_usd or 0.0)
    assert cheapest.cost_usd is not None
    over = cheapest.cost_usd - budget
    within = " within the deadline" if deadline is not None else ""
    return SizingBinding(
        constraint="budget",
        limit=budget,
        best=cheapest.cost_usd,
        by=over,
        text=(
            f"the budget of ${budget:,.0f}: the cheapest{within}, {cheapest.count} x "
            f"{cheapest.gpu} ({cheapest.setup}), costs ${cheapest.cost_usd:,.0f}, "
            f"${over:,.0f} ({over / budget:.0%}) over"
        ),
    )
