"""Progress callbacks: how long-running library work tells its caller how far it got.

Library functions take `progress: Progress | None` and call it with the amount of work done
since the last call (bytes, prompts, steps). They never print and never import rich: showing
progress is the caller's business (the CLI draws a bar on a terminal, a line per interval in a log).

A callback may also have a `set_total(n)` method. Work that learns its total once it has
opened its inputs calls `announce_total(progress, n)`, which does nothing for a plain function.
Work in stages of their own totals (`eval`: the teacher's continuations, then the draft's
measurement) names each with `announce_stage(progress, description, total)`, which calls the
callback's `stage(description, 0, total)` where it has one (else it announces the total).
Likewise a `plan(p)` method hears, through `announce_plan(progress, p)`, what the work will cost
before it starts (`finetune`'s `TrainPlan`).
"""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[int], None]


def announce_total(progress: Progress | None, total: int | None) -> None:
    """Tell `progress` how much work there is, if it wants to know (it has `set_total`)."""
    set_total = getattr(progress, "set_total", None)
    if set_total is not None and total is not None:
        set_total(total)


def announce_plan(progress: Progress | None, plan: object) -> None:
    """Tell `progress` what the work will cost before it starts, if it wants to know (it has `plan`).

    `finetune` hands its `TrainPlan` over before step 1; the CLI shows it before the first step.
    """
    show = getattr(progress, "plan", None)
    if show is not None and callable(show):
        show(plan)


def announce_stage(progress: Progress | None, description: str, total: int) -> None:
    """Start a named stage of `total` items: `progress.stage(description, 0, total)`, else `announce_total`."""
    stage = getattr(progress, "stage", None)
    if stage is not None and callable(stage):
        stage(description, 0, total)
    else:
        announce_total(progress, total)
