"""An eval's units (one record per prompt and sample) and what is computed from them: intervals, expected numbers.

A unit is one request: a prompt (its key, the SHA-256 prefix of its token ids, which is what pairs two evals)
and a sample of it. Its record holds vLLM's counts for that request (drafts, accepted per position) and, for
a simulation, the expected acceptance per position (`sampled_eval`); the eval JSON carries them all
(`EvalResult.records`), so intervals and paired comparisons (`compare`) are computed from the file alone.
Intervals are `acceptance_intervals`' (prompts as clusters, Student t): the unit of randomness is the
prompt, its samples are correlated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dspark_hub.train.evaluation.acceptance_intervals import acceptance_intervals, samples_for_half_width

if TYPE_CHECKING:
    from dspark_hub.train.evaluation.acceptance import AcceptanceStats, Measurement
    from dspark_hub.train.evaluation.decoding import EvalSampling
    from dspark_hub.train.evaluation.paths import Unit

#: The interval level every eval and comparison reports.
LEVEL = 0.95
#: The half-width an eval says the sample count for (`samples_for_half_width`).
TARGET_HALF_WIDTH = 0.02
#: The label of the expected numbers, wherever they are shown.
EXPECTED_LABEL = ("expected acceptance along the sampled paths (each draft's probability of acceptance given the "
                  "path, summed; unbiased for the counts, lower variance; not a count)")
#: The same under greedy decoding, where the two are one number.
EXPECTED_GREEDY_LABEL = "greedy: the expected acceptance is the count itself"


def count_prompts(measurement: Measurement, units: Sequence[Unit]) -> Measurement:
    """A sampled measurement with `prompts` counting distinct prompts (each loop counted its request as one)."""
    measurement.overall.prompts = len({u.prompt_key for u in units})
    for name, stats in measurement.by_dataset.items():
        stats.prompts = len({u.prompt_key for u in units if u.dataset == name})
    return measurement


def unit_records(units: Sequence[Unit], stats: Sequence[AcceptanceStats]) -> list[dict[str, Any]]:
    """One record per unit, in the order measured (`units[i]` is the prompt and sample of `stats[i]`)."""
    if len(units) != len(stats):
        raise ValueError(f"unit_records: {len(units)} units for {len(stats)} measured requests")
    return [{"prompt_key": unit.prompt_key, "prompt_index": unit.prompt_index, "dataset": unit.dataset,
             "sample": unit.sample, "drafts": s.drafts, "tokens": s.tokens,
             "accepted_per_position": list(s.accepted_per_position),
             "expected_per_position": [round(x, 9) for x in s.expected_per_position]}
            for unit, s in zip(units, stats, strict=True)]


def by_prompt(records: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Records grouped by prompt key, prompts in first-seen order (a prompt's samples together)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault(str(record["prompt_key"]), []).append(record)
    return groups


def counts(records: Sequence[Mapping[str, Any]], field: str = "accepted_per_position"
           ) -> tuple[list[list[float]], list[list[list[float]]]]:
    """`([prompt][sample] drafts, [prompt][sample][i] accepted)`, prompts as clusters (`field`: the counts or the
    expected numbers)."""
    groups = list(by_prompt(records).values())
    drafts = [[float(r["drafts"]) for r in group] for group in groups]
    accepted = [[[float(x) for x in r[field]] for r in group] for group in groups]
    return drafts, accepted


def intervals_of(records: Sequence[Mapping[str, Any]], field: str = "accepted_per_position"
                 ) -> dict[str, Any] | None:
    """AL and per-position 95% intervals over prompts, and the samples a prompt for +-0.02 on AL (None under 2
    samples of every prompt); None with fewer than 2 prompts or no drafts."""
    drafts, accepted = counts(records, field)
    if len(drafts) < 2 or sum(map(sum, drafts)) <= 0:
        return None
    found = acceptance_intervals(drafts, accepted, level=LEVEL)
    totals = [[sum(row) for row in sample] for sample in accepted]
    needed = (samples_for_half_width(totals, drafts, TARGET_HALF_WIDTH, level=LEVEL)
              if all(len(row) >= 2 for row in drafts) else None)
    return {"level": LEVEL, "over": "prompts", "prompts": len(drafts), "units": sum(len(row) for row in drafts),
            **found.to_dict(), "half_width": found.acceptance_length.half_width,
            f"samples_for_half_width_{TARGET_HALF_WIDTH}": needed}


def unit_intervals(units: Sequence[Unit], stats: Sequence[AcceptanceStats], *, expected: bool) -> dict[str, Any] | None:
    """`intervals_of` the counts (or with `expected` the expected numbers) of measured units."""
    field = "expected_per_position" if expected else "accepted_per_position"
    return intervals_of(unit_records(units, stats), field)


def expected_summary(units: Sequence[Unit], stats: Sequence[AcceptanceStats], overall: AcceptanceStats,
                     sampling: EvalSampling) -> dict[str, Any]:
    """The expected numbers of a simulation, labelled, with their intervals."""
    per_position = [x / overall.drafts if overall.drafts else float("nan") for x in overall.expected_per_position]
    return {"label": EXPECTED_GREEDY_LABEL if sampling.greedy else EXPECTED_LABEL,
            "acceptance_length": overall.expected_acceptance_length, "per_position": per_position,
            "intervals": unit_intervals(units, stats, expected=True)}
