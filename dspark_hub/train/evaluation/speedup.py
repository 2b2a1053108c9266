"""Will it be faster? The expected speedup per k from AL(k) and what a draft step and a verify pass cost.

One speculative step drafts k tokens (one DSpark block pass: `draft_cost(k)` target decode steps of time),
verifies them and the target's own next token in one target pass over k + 1 tokens (`verify_cost(k)` decode
steps), and emits AL(k) tokens on average (vLLM's acceptance length). Plain decoding emits one token per
decode step. So, per token of output,

    expected speedup S(k) = AL(k) / (draft_cost(k) + verify_cost(k))

and the best k is the one with the largest S(k) (the smaller k on a tie). Both costs are ratios to one
target decode step at the same context, so the unit cancels; they come from `costs.measure_costs` (timed on
this machine, for this target and draft) or from the user (their hardware's). What S leaves out: prefill,
the scheduler, rejection sampling and the draft's share of the context update; a batch of requests changes
both costs (a verify pass stops being nearly free once the GPU is busy). It is an estimate, and is labelled
with its costs' source wherever it is shown (`Speedup.label`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from dspark_hub.documents import Document
from dspark_hub.errors import UsageError

FORMULA = "S(k) = AL(k) / (draft_cost(k) + verify_cost(k)), each cost in target decode steps"


def expected_speedup(acceptance_length: float, draft_cost: float, verify_cost: float) -> float:
    """Tokens per unit of time relative to plain decoding: AL / (draft + verify), costs in decode steps."""
    return acceptance_length / (draft_cost + verify_cost)


@dataclass(frozen=True)
class Costs(Document):
    """Per k, a draft step's and a verify pass's time relative to one target decode step, and where they came from.

    `source` is `measured` (`costs.measure_costs`, on the machine that ran eval) or `given` (by the user,
    for their hardware); `detail` says how (device, dtype, threads, context, repeats) or what the user said.
    """

    KEYS = ("source", "detail", "draft=draft_by_k", "verify=verify_by_k", "decode_seconds")

    source: str
    detail: str
    draft: Mapping[int, float]
    verify: Mapping[int, float]
    decode_seconds: float | None = None

    @property
    def draft_by_k(self) -> dict[str, float]:
        return {str(k): self.draft[k] for k in sorted(self.draft)}

    @property
    def verify_by_k(self) -> dict[str, float]:
        return {str(k): self.verify[k] for k in sorted(self.verify)}

    @property
    def words(self) -> str:
        """`CPU costs measured on this machine (...)` or `user-given costs (...)`, for a label."""
        return f"costs measured on the machine that ran eval ({self.detail})" if self.source == "measured" \
            else f"user-given costs ({self.detail})"


def _per_k(values: Sequence[float], ks: Sequence[int], param: str) -> dict[int, float]:
    if any(not (v > 0 and math.isfinite(v)) for v in values):
        raise UsageError(f"{', '.join(map(str, values))}: a cost is a positive number of target decode steps",
                         param=param)
    if len(values) == 1:
        return {k: float(values[0]) for k in ks}
    if len(values) != len(ks):
        raise UsageError(f"{len(values)} costs for {len(ks)} k ({', '.join(map(str, ks))}); give one cost for "
                         "every k, or one for all", param=param)
    return {k: float(v) for k, v in zip(ks, values, strict=True)}


def given_costs(draft: Sequence[float], verify: Sequence[float], ks: Sequence[int], *,
                note: str | None = None) -> Costs:
    """The user's costs (one value for every k, or one per k in the order of `ks`).

    Raises:
        UsageError: a cost that is not a positive number, or a list whose length is not 1 or len(ks).
    """
    drafts, verifies = _per_k(draft, ks, "draft_cost"), _per_k(verify, ks, "verify_cost")
    detail = note or (f"draft step {_show(draft)}, verify of k + 1 tokens {_show(verify)} target decode steps")
    return Costs("given", detail, drafts, verifies)


def _show(values: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in values)


@dataclass(frozen=True)
class SpeedupRow(Document):
    """One k: the acceptance length measured, the two costs, and the expected speedup."""

    k: int
    acceptance_length: float
    draft_cost: float
    verify_cost: float
    expected_speedup: float


@dataclass(frozen=True)
class Speedup(Document):
    """`eval`'s `speedup`: the expected speedup per k and the best k, an estimate labelled with its costs."""

    KEYS = ("label", "formula", "costs", "by_k=rows", "best_k")

    costs: Costs
    by_k: Mapping[int, SpeedupRow]

    formula: ClassVar[str] = FORMULA

    @property
    def rows(self) -> dict[str, SpeedupRow]:
        return {str(k): self.by_k[k] for k in sorted(self.by_k)}

    @property
    def best_k(self) -> int:
        return max(sorted(self.by_k), key=lambda k: self.by_k[k].expected_speedup)

    @property
    def label(self) -> str:
        return f"Expected speedup: an estimate, {FORMULA}, from the measured AL(k) and {self.costs.words}"


def speedup_table(acceptance_lengths: Mapping[int, float], costs: Costs) -> Speedup:
    """The expected speedup at every k that has both an acceptance length and both costs.

    Raises:
        UsageError: no k has all three.
    """
    ks = [k for k in sorted(acceptance_lengths) if k in costs.draft and k in costs.verify]
    if not ks:
        raise UsageError(f"the costs cover k {sorted(costs.draft)}, the acceptance lengths "
                         f"{sorted(acceptance_lengths)}; give costs for the measured k", param="draft_cost")
    return Speedup(costs, {k: SpeedupRow(k, acceptance_lengths[k], costs.draft[k], costs.verify[k],
                                         expected_speedup(acceptance_lengths[k], costs.draft[k], costs.verify[k]))
                           for k in ks})
