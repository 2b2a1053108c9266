"""What to serve a draft with: `eval`'s k sweep, expected speedup, profile, context buckets and calibration.

`eval` counts with `measure_serving`: one lockstep pass over the rollouts (`measure_lanes`) for every drafter
it measures (the draft at its own k and at every k of `--k`, the reference and the prompt-lookup baseline at
the draft's k). The draft's verification steps at its own k also feed the acceptance by context length
(`--by-context`, `by_context.ContextTally`) and, for a draft with a confidence head, its calibration
(`calibration.CalibrationTally`). With costs (`--costs measure`: `costs.measure_costs`, or the user's
`--draft-cost` / `--verify-cost`) the acceptance lengths become an expected speedup per k (`speedup`); with
`--profile` all of it is written as `speculation_profile.json` beside the draft
(`format.speculation_profile`, Model-Optimizer's keys plus ours; `evaluate.check_profile_writable` refuses
an existing one without `force` before the run).

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

import itertools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dspark_hub.documents import Document
from dspark_hub.errors import UsageError
from dspark_hub.format.checkpoint import LocalSource
from dspark_hub.format.provenance import describe, identify
from dspark_hub.format.speculation_profile import PROFILE_NAME, KCounts, ProfileInputs, build_profile, trained_k
from dspark_hub.format.writer import atomic_file
from dspark_hub.progress import Progress
from dspark_hub.train.evaluation.acceptance import (
    DEFINITION,
    SIMULATION,
    WINDOW,
    AcceptanceStats,
    Measurement,
    ProposeMany,
    VerifyLoop,
)
from dspark_hub.train.evaluation.by_context import ByContext, ContextTally
from dspark_hub.train.evaluation.calibration import Calibration, CalibrationTally
from dspark_hub.train.evaluation.drafters import Drafter, SweepDrafter
from dspark_hub.train.evaluation.inputs import DraftUnderTest, EvalInputs
from dspark_hub.train.evaluation.speedup import Costs, Speedup, given_costs, speedup_table
from dspark_hub.train.target.target import load_target

if TYPE_CHECKING:
    from dspark_hub.train.target.generate import Rollout

#: `(k, rollout, anchor p, the drafts, how many were accepted)`: one verification step of one request.
Observer = Callable[[int, "Rollout", int, list[int], int], None]
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


@dataclass
class KMeasurement(Document):
    """One k of a sweep: its counts (overall and per dataset) and the mean of each request's acceptance length."""

    KEYS = ("**measurement", "per_request_acceptance_length")

    measurement: Measurement
    request_lengths: list[float]

    @property
    def overall(self) -> AcceptanceStats:
        return self.measurement.overall

    @property
    def per_request_acceptance_length(self) -> float | None:
        """Model-Optimizer's `mean_accept_length_per_request`: every request weighs the same."""
        return sum(self.request_lengths) / len(self.request_lengths) if self.request_lengths else None


@dataclass
class Sweep(Document):
    """Acceptance at every k of `eval --k`, measured on the same rollouts in one run."""

    KEYS = ("ks", "shared", "by_k=rows")

    by_k: dict[int, KMeasurement]

    shared: ClassVar[str] = ("the target's rollouts and each rollout's draft context, once for every k; each k "
                             "drafts its own blocks and verifies on its own path")

    @property
    def ks(self) -> list[int]:
        return sorted(self.by_k)

    @property
    def rows(self) -> dict[str, KMeasurement]:
        return {str(k): self.by_k[k] for k in self.ks}


@dataclass(frozen=True)
class Lane:
    """One drafter of a lockstep pass: its name, how it drafts at each k, the k it is counted at, and who else is
    told of each of its verification steps."""

    name: str
    drafter: SweepDrafter
    ks: tuple[int, ...]
    observe: Observer | None = None


def one_k(drafter: Drafter, k: int) -> SweepDrafter:
    """A one-k drafter (rollouts -> propose_many) as a lane's drafter."""
    return lambda rollouts, ks: {k: drafter(rollouts)}


def measure_lanes(rollouts: Iterable[Rollout], lanes: Sequence[Lane], progress: Progress | None = None, *,
                  max_tokens: int | None = None, stop_ids: Iterable[int] = (),
                  window: int = WINDOW) -> dict[str, Sweep]:
    """Every lane's verify loops at each of its k over the same rollouts, `window` rollouts at a time, in lockstep:
    each round drafts one step of every unfinished request of every lane and k (one `propose_many` call each).
    Each lane's counts at a k are those `acceptance.measure_batched` gives for that drafter at that k alone."""
    stops = list(stop_ids)
    keys = [(lane.name, k) for lane in lanes for k in sorted(set(lane.ks))]
    overall = {key: AcceptanceStats(key[1]) for key in keys}
    by_dataset: dict[tuple[str, int], dict[str, AcceptanceStats]] = {key: {} for key in keys}
    lengths: dict[tuple[str, int], list[float]] = {key: [] for key in keys}
    units: dict[tuple[str, int], list[AcceptanceStats]] = {key: [] for key in keys}
    watchers = {lane.name: lane.observe for lane in lanes}
    pending = iter(rollouts)
    while chunk := list(itertools.islice(pending, window)):
        proposers: dict[tuple[str, int], ProposeMany] = {}
        for lane in lanes:
            made = lane.drafter(chunk, sorted(set(lane.ks)))
            proposers.update({(lane.name, k): made[k] for k in lane.ks})
        loops = {key: [VerifyLoop(r, key[1], max_tokens=max_tokens, stop_ids=stops) for r in chunk] for key in keys}
        stepped = True
        while stepped:          # one round: a step of every unfinished request of every lane and k
            stepped = False
            for key, these in loops.items():
                requests = [(i, p) for i, loop in enumerate(these) if (p := loop.anchor) is not None]
                stepped = stepped or bool(requests)
                watch = watchers[key[0]]
                for (i, p), drafts in zip(requests, proposers[key](requests) if requests else [], strict=True):
                    these[i].step(drafts)
                    if watch is not None:
                        watch(key[1], chunk[i], p, drafts, these[i].p - p - 1)   # the anchor moved accepted + 1 on
        for key in keys:
            for rollout, loop in zip(chunk, loops[key], strict=True):
                overall[key].add(loop.stats)
                units[key].append(loop.stats)
                if loop.stats.drafts:
                    lengths[key].append(loop.stats.acceptance_length)
                if rollout.dataset is not None:
                    by_dataset[key].setdefault(rollout.dataset, AcceptanceStats(key[1])).add(loop.stats)
        if progress:
            progress(len(chunk))
    return {lane.name: Sweep({k: KMeasurement(Measurement(overall[(lane.name, k)], by_dataset[(lane.name, k)],
                                                          units[(lane.name, k)]),
                                              lengths[(lane.name, k)]) for k in sorted(set(lane.ks))})
            for lane in lanes}


def measure_sweep(rollouts: Iterable[Rollout], drafter: SweepDrafter, ks: Sequence[int],
                  progress: Progress | None = None, *, max_tokens: int | None = None, stop_ids: Iterable[int] = (),
                  window: int = WINDOW, observe: Observer | None = None) -> Sweep:
    """One drafter at every k of `ks` (`measure_lanes` with one lane)."""
    lane = Lane("draft", drafter, tuple(ks), observe)
    return measure_lanes(rollouts, [lane], progress, max_tokens=max_tokens, stop_ids=stop_ids,
                         window=window)["draft"]


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


def measure_serving(inputs: EvalInputs, drafter: SweepDrafter, options: ServingOptions, *,
                    others: dict[str, Drafter] | None = None, bounds: dict[str, Any],
                    progress: Progress | None = None) -> ServingResults:
    """Count the draft at every k of the sweep, and the `others` (name -> drafter) at the draft's k, in one
    lockstep pass with the observers `options` asks for; then the speedup when costs are given or measured, and
    the profile.

    Raises:
        UsageError: costs that do not fit the sweep (`speedup.given_costs`), or no rollout long enough to time
            costs on (`costs.context_rollout`).
    """
    k, rollouts = inputs.draft.k, inputs.rollouts
    assert rollouts is not None    # the simulation's inputs always hold rollouts
    ks = options.sweep_ks(k)
    tallies: list[Any] = [CalibrationTally(k)]
    if options.by_context or options.context_edges:
        tallies.append(ContextTally(k, list(options.context_edges) if options.context_edges else None))

    def observe(*step: Any) -> None:
        for tally in tallies:
            tally(*step)

    lanes = [Lane("draft", drafter, tuple(ks), observe),
             *(Lane(name, one_k(other, k), (k,)) for name, other in (others or {}).items())]
    measured = measure_lanes(rollouts, lanes, progress, **bounds)
    sweep = measured["draft"]
    out = ServingResults(sweep, {name: measured[name].by_k[k].measurement for name in others or {}},
                         calibration=tallies[0].result(), by_context=tallies[1].result() if len(tallies) > 1 else None)
    costs = _costs(inputs, drafter, options, ks)
    if costs is not None:
        out.speedup = speedup_table({k: m.overall.acceptance_length for k, m in sweep.by_k.items()}, costs)
    if options.profile:
        out.profile = str(write_profile(inputs, out, force=options.force))
    return out


def _costs(inputs: EvalInputs, drafter: SweepDrafter, options: ServingOptions, ks: list[int]) -> Costs | None:
    if options.costs == MEASURE:
        from dspark_hub.train.evaluation.costs import measure_costs  # torch and timing: only here

        assert inputs.rollouts is not None
        target = load_target(inputs.target.path, dtype="float32")
        return measure_costs(target, list(inputs.rollouts), drafter, ks)
    if options.draft_cost and options.verify_cost:
        return given_costs(options.draft_cost, options.verify_cost, ks)
    return None


def write_profile(inputs: EvalInputs, results: ServingResults, *, force: bool) -> Path:
    """`speculation_profile.json` beside the draft, written atomically (refused over one without `force`)."""
    doc = build_profile(profile_inputs(inputs, results))
    path = Path(inputs.draft.path) / PROFILE_NAME
    with atomic_file(path, force=force, mode="w") as handle:
        handle.write(json.dumps(doc, indent=2) + "\n")
    return path


def profile_inputs(inputs: EvalInputs, results: ServingResults) -> ProfileInputs:
    """The profile's facts: the counts per k, the draft by its digests (never its path), the target by its identity."""
    draft, sweep = inputs.draft, results.sweep
    by_k = {k: KCounts(k, m.overall.drafts, m.overall.accepted_per_position, m.per_request_acceptance_length)
            for k, m in sweep.by_k.items()}
    trained, _ = trained_k(draft.format, draft.config, LocalSource(draft.path))
    facts = inputs.facts
    conditions = {"engine": f"dspark-hub eval, simulated ({SIMULATION})", "decoding": "greedy", "temperature": 0.0,
                  "dtype": "float32", "prompts": sweep.by_k[draft.k].overall.prompts,
                  "prompts_sha256": facts.get("prompts_sha256"), "max_new_tokens": facts.get("max_new_tokens"),
                  "datasets": sorted(sweep.by_k[draft.k].measurement.by_dataset)}
    return ProfileInputs(
        by_k=by_k, num_speculative_tokens=draft.k, draft_checkpoint=_draft_id(draft),
        target_model=facts.get("teacher"), block_size=draft.format.block_size(draft.config) or trained,
        trained_k=trained,
        per_category={name: stats.acceptance_length
                      for name, stats in sweep.by_k[draft.k].measurement.by_dataset.items()},
        measurement_conditions=conditions, definition=DEFINITION,
        speedup=results.speedup.to_dict() if results.speedup is not None else None)


def _draft_id(draft: DraftUnderTest) -> str | None:
    """The draft as a profile names it: its Hub id, or the digests of its files (the profile itself left out)."""
    identity = identify(draft.path)
    if isinstance(identity, dict) and isinstance(identity.get("sha256"), dict):
        identity["sha256"].pop(PROFILE_NAME, None)
    return describe(identity)
