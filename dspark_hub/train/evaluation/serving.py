"""What to serve a draft with: `eval`'s k sweep, expected speedup, profile, context buckets and calibration.

`eval` counts its draft with `measure_serving`: one lockstep pass over the rollouts (`sweep.measure_sweep`)
at the eval's k and at every k of `--k`, whose verification steps also feed the acceptance by context length
(`--by-context`, `by_context.ContextTally`) and, for a draft with a confidence head, its calibration
(`calibration.CalibrationTally`), both at the eval's k. With costs (`--costs measure`, or the user's
`--draft-cost` / `--verify-cost`) the acceptance lengths become an expected speedup per k (`speedup`); with
`--profile` all of it is written as `speculation_profile.json` beside the draft
(`format.speculation_profile`, Model-Optimizer's keys plus ours).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub.errors import UsageError
from dspark_hub.format.checkpoint import LocalSource
from dspark_hub.format.provenance import describe, identify
from dspark_hub.format.speculation_profile import PROFILE_NAME, KCounts, ProfileInputs, build_profile, trained_k
from dspark_hub.format.writer import atomic_file, check_writable, refuse_own_inputs
from dspark_hub.progress import Progress
from dspark_hub.train.evaluation.acceptance import DEFINITION, SIMULATION
from dspark_hub.train.evaluation.by_context import ByContext, ContextTally
from dspark_hub.train.evaluation.calibration import Calibration, CalibrationTally
from dspark_hub.train.evaluation.drafters import SweepDrafter
from dspark_hub.train.evaluation.inputs import DraftUnderTest, EvalInputs
from dspark_hub.train.evaluation.speedup import Costs, Speedup, given_costs, speedup_table
from dspark_hub.train.evaluation.sweep import Sweep, measure_sweep, parse_ks

#: `costs` values: time them here.
MEASURE = "measure"


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


def profile_path(draft: str | os.PathLike[str]) -> Path:
    return Path(draft) / PROFILE_NAME


def check_profile_writable(draft: str | os.PathLike[str], inputs: Sequence[tuple[str, Any]], *, force: bool) -> None:
    """Before the long run: `speculation_profile.json` may be written beside the draft (the one file of the draft's
    folder eval writes) and is not there already, unless `force`.

    Raises:
        UsageError: the path is (a link to) one of the inputs.
        RefusedOverwriteError: a profile is there and `force` is off.
    """
    path = profile_path(draft)
    refuse_own_inputs(path, [("draft", draft), *inputs], param="profile", folder=False, keep=(PROFILE_NAME,))
    check_writable(path, force=force)


@dataclass
class ServingResults:
    """What one lockstep pass measured: every k, and at the eval's k the context buckets and the calibration."""

    sweep: Sweep
    by_context: ByContext | None = None
    calibration: Calibration | None = None
    speedup: Speedup | None = None


def measure_serving(inputs: EvalInputs, drafter: SweepDrafter, options: ServingOptions, *,
                    bounds: dict[str, Any], progress: Progress | None = None) -> ServingResults:
    """Count the draft at every k of the sweep in one lockstep pass, with the observers `options` asks for,
    then the speedup when costs are given or measured.

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

    sweep = measure_sweep(rollouts, drafter, ks, progress, observe=observe, **bounds)
    out = ServingResults(sweep, calibration=tallies[0].result(),
                         by_context=tallies[1].result() if len(tallies) > 1 else None)
    costs = _costs(inputs, drafter, options, ks)
    if costs is not None:
        out.speedup = speedup_table(sweep.acceptance_lengths(), costs)
    return out


def _costs(inputs: EvalInputs, drafter: SweepDrafter, options: ServingOptions, ks: list[int]) -> Costs | None:
    if options.draft_cost and options.verify_cost:
        return given_costs(options.draft_cost, options.verify_cost, ks)
    if options.costs == MEASURE:
        from dspark_hub.train.evaluation.costs import measure_costs  # torch and the target model: only here

        assert inputs.rollouts is not None
        return measure_costs(inputs.target, list(inputs.rollouts), drafter, ks)
    return None


def write_profile(inputs: EvalInputs, results: ServingResults, *, force: bool) -> Path:
    """`speculation_profile.json` beside the draft, written atomically (refused over one without `force`)."""
    draft = inputs.draft
    doc = build_profile(profile_inputs(inputs, results))
    path = profile_path(draft.path)
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
