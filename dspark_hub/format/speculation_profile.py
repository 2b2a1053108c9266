"""`speculation_profile.json`: how good a draft is, in the file runtimes and simulators read beside the weights.

The keys are those of NVIDIA Model-Optimizer's profile (schema_version "1.0", `build_profile` in
`examples/specdec_bench/specdec_bench/speculation_profile.py`, pull requests #2247 and #2313; read, not
executed), filled from dspark-hub's counts, plus one object of ours, `dspark_hub` (docs/acceptance.md
documents every key):

- `marginal_accept_rates[i]`: P(the first i+1 drafts all accepted), vLLM's `per_position`;
  `conditional_accept_rates[i]`: P(draft i+1 accepted | the first i accepted) = marginal[i] / marginal[i-1].
- `mean_accept_length`: tokens a verification step emits, `1 + sum(marginal)` (the per-step mean);
  `mean_accept_length_per_request`: the mean of each request's own.
- `acceptance_length_histogram`: `{"L": steps that emitted L tokens}`, L = accepted drafts + 1.
- `accept_length_model`: `measured_per_k` (a DSpark block is re-planned when k changes, so each k is
  measured, never extrapolated); `accept_length_by_k`: the measured mean at every k of the sweep.
- `max_supported_k`: the drafted tokens the draft was trained to propose (its block), else the largest k
  measured; serving more is `verify`'s SERVED_K_BEYOND_BLOCK.
- `validation`: Model-Optimizer's two checks (the mean against `1 + sum(marginal)`, marginals not increasing).
- `dspark_hub`: our schema id, the acceptance definition, per-position rates at every k, the expected
  speedup per k with its costs and their source (when costs were given or measured).

`accept_length_by_k` reads the mean acceptance length per k back from a profile or from an `eval --json`
document's `sweep` (what `verify` reports a served k's measured cost with). Stdlib only.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dspark_hub import schemas
from dspark_hub.format.checkpoint import Source, read_at_most
from dspark_hub.format.jsonio import loads_strict
from dspark_hub.format.provenance import TRAINING_ARGS_NAME
from dspark_hub.format.registry import DraftFormat

#: The file's name beside the weights.
PROFILE_NAME = "speculation_profile.json"
#: Model-Optimizer's schema version these keys follow.
MODELOPT_SCHEMA_VERSION = "1.0"
#: Model-Optimizer's tolerance for the mean-consistency check.
MEAN_TOLERANCE = 0.02
#: The eval document's key holding the k sweep (`train.evaluation.serving.Sweep`), and its per-k table.
SWEEP_KEY, BY_K_KEY = "sweep", "by_k"


@dataclass(frozen=True)
class KCounts:
    """The counts at one k: verification steps (`drafts`), `accepted_per_position` (vLLM's), and the mean of
    each request's own acceptance length."""

    k: int
    drafts: int
    accepted_per_position: Sequence[int]
    per_request_acceptance_length: float | None = None

    @property
    def marginal(self) -> list[float]:
        return [a / self.drafts if self.drafts else 0.0 for a in self.accepted_per_position]

    @property
    def conditional(self) -> list[float]:
        survived = [1.0, *self.marginal]
        return [now / before if before else 0.0 for before, now in itertools.pairwise(survived)]

    @property
    def acceptance_length(self) -> float:
        return 1.0 + sum(self.accepted_per_position) / self.drafts if self.drafts else float("nan")

    @property
    def histogram(self) -> dict[str, int]:
        """Steps per emitted length `L` (accepted drafts + 1), every length 1..k+1 present."""
        survivors = [self.drafts, *self.accepted_per_position, 0]
        return {str(j + 1): survivors[j] - survivors[j + 1] for j in range(self.k + 1)}


@dataclass(frozen=True)
class ProfileInputs:
    """What a profile says: the counts per k, which k is the served default, and what was measured."""

    by_k: Mapping[int, KCounts]
    num_speculative_tokens: int
    draft_checkpoint: str | None
    target_model: str | None
    block_size: int | None = None           # the block the draft trained with, when recorded
    trained_k: int | None = None            # drafted tokens a step at that block (max_supported_k)
    per_category: Mapping[str, float] = field(default_factory=dict)   # dataset -> acceptance length at k
    measurement_conditions: Mapping[str, Any] = field(default_factory=dict)
    definition: str | None = None
    speedup: Mapping[str, Any] | None = None


def _round(values: Sequence[float]) -> list[float]:
    return [round(v, 6) for v in values]


def _validation(mean: float, marginal: Sequence[float]) -> dict[str, Any]:
    implied = 1.0 + sum(marginal)
    delta = abs(implied - mean)
    violations = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}
                  for i in range(1, len(marginal)) if marginal[i] > marginal[i - 1] + 1e-9]
    return {"mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                 "reported_mean_accept_length": round(mean, 6), "abs_delta": round(delta, 6),
                                 "tolerance": MEAN_TOLERANCE, "passed": delta <= MEAN_TOLERANCE},
            "marginal_monotonicity": {"passed": not violations, "violations": violations}}


def build_profile(inputs: ProfileInputs) -> dict[str, Any]:
    """The profile's JSON object (Model-Optimizer's keys, then ours under `dspark_hub`).

    Raises:
        KeyError: `num_speculative_tokens` is not one of the measured k (a bug in the caller).
    """
    served = inputs.by_k[inputs.num_speculative_tokens]
    mean = served.acceptance_length
    ks = sorted(inputs.by_k)
    per_request = served.per_request_acceptance_length
    return {
        "schema_version": MODELOPT_SCHEMA_VERSION,
        "measured": True,
        "method": "dspark",
        "draft_checkpoint": inputs.draft_checkpoint,
        "target_model": inputs.target_model,
        "num_speculative_tokens": served.k,
        "block_size": inputs.block_size,
        "max_supported_k": inputs.trained_k if inputs.trained_k is not None else max(ks),
        "verification_method": "longest_prefix",
        "conditional_accept_rates": _round(served.conditional),
        "marginal_accept_rates": _round(served.marginal),
        "mean_accept_length": round(mean, 6),
        "mean_accept_length_per_request": None if per_request is None else round(per_request, 6),
        "accept_length_model": "measured_per_k",
        "accept_length_by_k": {str(k): round(inputs.by_k[k].acceptance_length, 6) for k in ks},
        "acceptance_length_histogram": served.histogram,
        "per_category": {name: {"mean_accept_length": round(al, 6)} for name, al in sorted(inputs.per_category.items())}
        or None,
        "measurement_conditions": dict(inputs.measurement_conditions),
        "validation": _validation(mean, served.marginal),
        "dspark_hub": {
            "schema": schemas.SPECULATION_PROFILE,
            "definition": inputs.definition,
            "max_supported_k_source": "the block the draft trained with" if inputs.trained_k is not None
            else "the largest k measured (the block the draft trained with is not recorded)",
            "marginal_accept_rates_by_k": {str(k): _round(inputs.by_k[k].marginal) for k in ks},
            "drafts_by_k": {str(k): inputs.by_k[k].drafts for k in ks},
            "expected_speedup": dict(inputs.speedup) if inputs.speedup is not None else None,
        },
    }


#: The most of `training_args.json` read to find the block a k3_dspark draft trained with.
_ARGS_LIMIT = 1 << 20


def trained_k(fmt: DraftFormat, config: Mapping[str, Any], source: Source) -> tuple[int | None, str]:
    """Drafted tokens a step at the block the draft trained with, and where that came from: its config (a
    speculators `block_size`), else the `block_size` `finetune` recorded in `training_args.json`; None when
    neither records it (a k3_dspark draft's block is an engine setting)."""
    from_config = fmt.trained_k(config)
    if from_config is not None:
        return from_config, "config.json block_size"
    size = source.list_files().get(TRAINING_ARGS_NAME)
    try:
        raw = read_at_most(source, TRAINING_ARGS_NAME, size, _ARGS_LIMIT) if size is not None else None
        args = loads_strict(raw, path=TRAINING_ARGS_NAME) if raw is not None else None
    except (ValueError, OSError):   # an unreadable record says nothing about the block
        args = None
    block = args.get("block_size") if isinstance(args, Mapping) else None
    if isinstance(block, int) and not isinstance(block, bool) and block > 0:
        return block, f"{TRAINING_ARGS_NAME} block_size"
    return None, "not recorded (no block_size in config.json or training_args.json)"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def accept_length_by_k(doc: Mapping[str, Any]) -> dict[int, float]:
    """The measured mean acceptance length per k of a profile (`accept_length_by_k`) or of an `eval --json`
    document (its `sweep`, else its own k); empty when the document holds neither."""
    found: dict[int, float] = {}
    by_k = doc.get("accept_length_by_k")
    if isinstance(by_k, Mapping):
        found = {int(k): v for k, value in by_k.items() if str(k).isdigit() and (v := _number(value)) is not None}
    sweep = doc.get(SWEEP_KEY)
    rows = sweep.get(BY_K_KEY) if isinstance(sweep, Mapping) else None
    if isinstance(rows, Mapping):
        found |= {int(k): v for k, row in rows.items() if str(k).isdigit() and isinstance(row, Mapping)
                  and (v := _number(row.get("acceptance_length"))) is not None}
    k, own = doc.get("k"), _number(doc.get("acceptance_length"))
    if isinstance(k, int) and not isinstance(k, bool) and own is not None:
        found.setdefault(k, own)
    return dict(sorted(found.items()))


def expected_speedup_by_k(doc: Mapping[str, Any]) -> dict[int, float]:
    """The expected speedup per k an eval document (`speedup.by_k`) or a profile (`dspark_hub.expected_speedup`)
    states; empty when it states none."""
    section = doc.get("speedup")
    if not isinstance(section, Mapping):
        ours = doc.get("dspark_hub")
        section = ours.get("expected_speedup") if isinstance(ours, Mapping) else None
    rows = section.get(BY_K_KEY) if isinstance(section, Mapping) else None
    if not isinstance(rows, Mapping):
        return {}
    return dict(sorted((int(k), v) for k, row in rows.items() if str(k).isdigit() and isinstance(row, Mapping)
                       and (v := _number(row.get("expected_speedup"))) is not None))
