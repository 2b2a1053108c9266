"""What to serve a draft with: `eval`'s k sweep, expected speedup, profile, context buckets and calibration.

`eval` counts with `measure_serving`: one lockstep pass over the rollouts (`acceptance.measure_lanes`) for every
drafter it measures (the draft at its own k and at every k of `--k`, the reference and the prompt-lookup baseline
at the draft's k), judged by the eval's verifier (greedy, or a sampled eval's `sampled_eval.sampled_verify`, whose
counts are at the draft's k alone). The draft's verification steps at its own k also feed the acceptance by
context length (`--by-context`, `by_context.ContextTally`) and, for a draft with a confidence head, its calibration
(`calibration.CalibrationTally`). With costs (`--costs measure`: `costs.measure_costs`, or the user's
`--draft-cost` / `--verify-cost`) the acceptance lengths become an expected speedup per k (`speedup`); with
`--profile` all of it is written as `speculation_profile.json` beside the draft (`profile.write_profile`).

The k sweep (`eval --k 1,2,...`): each k counted as its own `eval --block-size k` counts. What is shared: the
target's rollouts (rolled out once, `max_new_tokens + max(k)` tokens, so every k's last step can overshoot as
in vLLM) and, per rollout, the draft's context (k3_dspark latents, speculators keys and values:
`drafters.sweep_drafter_for`). What is not: a DSpark block is drafted in one non-causal pass over its k rows,
so the drafts of a block of 7 are not the first drafts of a block of 5 (Model-Optimizer's profile says the
same of block-parallel methods: `accept_length_model: measured_per_k`), and each k's verify loop takes its own
path (a step that accepts j tokens moves the anchor j + 1 on). So every k has its own loops and block
forwards, run in lockstep: each round drafts one step of every unfinished request of every lane.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dspark_hub.errors import UsageError
from dspark_hub.progress import Progress
from dspark_hub.train.evaluation.acceptance import (
    Lane,
    Measurement,
    Sweep,
    Verifier,
    exact_verify,
    measure_lanes,
    one_k,
)
from dspark_hub.train.evaluation.by_context import ByContext, ContextTally
from dspark_hub.train.evaluation.calibration import Calibration, CalibrationTally
from dspark_hub.train.evaluation.drafters import EvalDrafters
from dspark_hub.train.evaluation.inputs import EvalInputs
from dspark_hub.train.evaluation.profile import write_profile
from dspark_hub.train.evaluation.speedup import Costs, Speedup, given_costs, speedup_table
from dspark_hub.train.evaluation.units import count_prompts
from dspark_hub.train.target.target import load_target

if TYPE_CHECKING:
    pass

#: The most k a sweep measures (each k is a verify loop and a block forward per step).
MAX_KS = 32
_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")
#: `costs` values: time them here.
MEASURE = "measure"


def parse_ks(text: str, *, block: int, param: str = "ks") -> list[int]:
    """`1,2,4`, `1-7`, `2-4,8` or `block` (1 to the draft's k) as a sorted list of distinct k.

    Raises:
        UsageError: an empty list, a k below 1, a range that runs down, or more than `MAX_KS` values.
    """
    ks: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if part == "block":
            ks.update(range(1, block + 1))
        elif part.isdigit():
            ks.add(int(part))
        elif m := _RANGE.match(part):
            low, high = int(m.group(1)), int(m.group(2))
            if low > high:
                raise UsageError(f"{part!r} runs down; write the smaller k first, e.g. {high}-{low}", param=param)
            ks.update(range(low, high + 1))
        else:
            raise UsageError(f"{part!r} is not a k; write e.g. 1,2,4 or 1-7 or block (1 to the draft's {block})",
                             param=param)
    if not ks or min(ks) < 1:
        raise UsageError(f"{text!r}: every k is a number of drafted tokens, 1 or more", param=param)
    if len(ks) > MAX_KS:
        raise UsageError(f"{text!r} names {len(ks)} k; measure at most {MAX_KS} in one run", param=param)
    return sorted(ks)


@dataclass(frozen=True)
class ServingOptions:
    """The serving questions one `eval` answers besides its own k (every one optional).

    `ks`: `eval --k` (`sweep.parse_ks`'s text, or the list); `by_context` with `context_edges` (None: powers of
    two); `costs`: `"measure"` to time them here, or None; `draft_cost` / `verify_cost`: the user's (one value,
    or one per k of the sweep); `profile`: write `speculation_profile.json` beside the draft, `force` over one.
    """

    ks: str | Sequence[int] | None = None
    by_context: bool = False
    context_edges: Sequence[int] | None = None
    costs: str | None = None
    draft_cost: Sequence[float] | None = None
    verify_cost: Sequence[float] | None = None
    profile: bool = False
    force: bool = False

    @property
    def asked(self) -> bool:
        """Any question beyond the eval's own k (what the vllm engine cannot answer)."""
        return bool(self.ks or self.by_context or self.context_edges or self.costs or self.draft_cost
                    or self.verify_cost or self.profile)

    def sweep_ks(self, k: int) -> list[int]:
        """The k measured: the eval's own and those of `ks`."""
        if self.ks is None:
            return [k]
        text = self.ks if isinstance(self.ks, str) else ",".join(map(str, self.ks))
        return sorted({k, *parse_ks(text, block=k)})

    def lookahead(self) -> int:
        """The largest k `ks` names outright (`block` is at most the draft's own k): what the rollouts must
        continue past `max_new_tokens` besides the draft's k."""
        return max(self.sweep_ks(1))

    def check(self) -> None:
        """The combinations that cannot work, refused before anything runs.

        Raises:
            UsageError: naming the option.
        """
        if self.costs not in (None, MEASURE):
            raise UsageError(f"costs {self.costs!r}: `measure` times them here; give your hardware's with "
                             "`draft_cost` and `verify_cost`", param="costs")
        if self.costs == MEASURE and (self.draft_cost or self.verify_cost):
            raise UsageError("measured costs or given ones, not both; drop `costs` or the given costs", param="costs")
        if bool(self.draft_cost) != bool(self.verify_cost):
            raise UsageError("a speedup needs both costs: give `draft_cost` and `verify_cost`",
                             param="verify_cost" if self.draft_cost else "draft_cost")
        self.lookahead()          # a k list that cannot be read fails here, before anything runs


@dataclass
class ServingResults:
    """What one lockstep pass measured: the draft at every k (and at its own k the context buckets and the
    calibration), the other drafters at the draft's k, and the speedup and profile when asked for."""

    sweep: Sweep
    others: dict[str, Measurement] = field(default_factory=dict)
    by_context: ByContext | None = None
    calibration: Calibration | None = None
    speedup: Speedup | None = None
    profile: str | None = None


def measure_serving(inputs: EvalInputs, drafters: EvalDrafters, options: ServingOptions, *,
                    verify: Verifier = exact_verify, bounds: dict[str, Any],
                    progress: Progress | None = None) -> ServingResults:
    """Count the draft at every k of the sweep, and the other drafters at the draft's k, in one lockstep pass
    judged by `verify` (`acceptance.measure_lanes`), with the observers `options` asks for (and, under greedy
    decoding, the calibration of a draft's confidence head); then the speedup when costs are given or measured,
    and the profile.

    Raises:
        UsageError: costs that do not fit the sweep (`speedup.given_costs`), or no rollout long enough to time
            costs on (`costs.context_rollout`).
    """
    k, rollouts = inputs.draft.k, inputs.rollouts
    assert rollouts is not None    # the simulation's inputs always hold rollouts
    ks = options.sweep_ks(k)
    calibration = CalibrationTally(k) if inputs.sampling.greedy else None     # a confidence head's: greedy only
    by_context = (ContextTally(k, list(options.context_edges) if options.context_edges else None)
                  if options.by_context or options.context_edges else None)
    tallies = [tally for tally in (calibration, by_context) if tally is not None]

    def observe(*step: Any) -> None:
        for tally in tallies:
            tally(*step)

    lanes = [Lane("draft", drafters.draft, tuple(ks), observe if tallies else None),
             *(Lane(name, one_k(other, k), (k,)) for name, other in drafters.others.items())]
    measured = measure_lanes(rollouts, lanes, progress, verify=verify, **bounds)
    if not inputs.sampling.greedy:      # a loop counts its request; a prompt has `samples` of them
        for counted in [*measured["draft"].by_k.values(), *(measured[name].by_k[k] for name in drafters.others)]:
            count_prompts(counted.measurement, inputs.units)
    sweep = measured["draft"]
    out = ServingResults(sweep, {name: measured[name].by_k[k].measurement for name in drafters.others},
                         calibration=calibration.result() if calibration is not None else None,
                         by_context=by_context.result() if by_context is not None else None)
    costs: Costs | None = None
    if options.costs == MEASURE:
        from dspark_hub.train.evaluation.costs import measure_costs  # torch and timing: only here

        target = load_target(inputs.target.path, dtype="float32")
        costs = measure_costs(target, list(rollouts), drafters.draft, ks)
    elif options.draft_cost and options.verify_cost:
        costs = given_costs(options.draft_cost, options.verify_cost, ks)
    if costs is not None:
        out.speedup = speedup_table({k: m.overall.acceptance_length for k, m in sweep.by_k.items()}, costs)
    if options.profile:
        out.profile = str(write_profile(inputs, sweep, out.speedup, force=options.force))
    return out
