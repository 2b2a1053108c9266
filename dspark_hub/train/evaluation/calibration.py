"""Is the confidence head right? Its estimated prefix survival against the acceptance observed, per position.

A DSpark confidence head scores each drafted slot: `c_i`, the probability that draft `i` is accepted once
drafts `0..i-1` were (speculators' DSpark docs; vLLM computes it at proposal time from the slot's row and
the previous token). A scheduler verifies the prefix whose estimated survival `s_i = c_0 * ... * c_i` is
high enough, so `s_i` is what must match: the probability that the first `i + 1` drafts are all accepted,
which is what vLLM's `per_position[i]` counts. For every verification step of the eval's k and every
position `i`, the pair (`s_i`, whether the step accepted more than `i` drafts) goes into:

- per position: the mean estimate against the observed rate (equal to the eval's `per_position[i]`,
  the same steps) and that position's expected calibration error;
- a reliability table over all positions: `BINS` equal bins of the estimate, each with its count, mean
  estimate and observed rate;
- the expected calibration error, `sum_b (n_b / N) |mean estimate_b - observed_b|` over the bins.

A head is called calibrated here when its overall ECE is at most `CALIBRATED_ECE`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from dspark_hub.documents import Document

if TYPE_CHECKING:
    from dspark_hub.train.target.generate import Rollout

#: Equal-width bins of the estimate in the reliability table.
BINS = 10
#: The overall expected calibration error at or below which a head is called calibrated.
CALIBRATED_ECE = 0.05


@dataclass(frozen=True)
class Pair:
    """One position of one verification step: the estimated prefix survival and whether the prefix survived."""

    position: int
    estimate: float
    survived: bool


def prefix_survival(confidence: Sequence[float]) -> list[float]:
    """`s_i = c_0 * ... * c_i`: the estimated probability that the first `i + 1` drafts are all accepted."""
    out, running = [], 1.0
    for c in confidence:
        running *= c
        out.append(running)
    return out


def pairs_of_step(confidence: Sequence[float], accepted: int) -> list[Pair]:
    """The (estimate, outcome) pair of every position of one step that accepted `accepted` drafts."""
    return [Pair(i, s, accepted > i) for i, s in enumerate(prefix_survival(confidence))]


@dataclass(frozen=True)
class ReliabilityBin(Document):
    """One bin of the estimate: `[low, high)` (the last one includes 1), its pairs, mean estimate and observed rate."""

    low: float
    high: float
    count: int
    estimated: float | None
    observed: float | None


@dataclass(frozen=True)
class PositionCalibration(Document):
    """One position: its pairs (the eval's drafts), mean estimated survival, observed survival, and its own ECE."""

    position: int
    drafts: int
    estimated: float
    observed: float
    ece: float


def reliability(pairs: Sequence[Pair], bins: int = BINS) -> list[ReliabilityBin]:
    """Every pair in the bin of its estimate (`bins` equal bins of [0, 1])."""
    sums = [[0, 0.0, 0] for _ in range(bins)]       # count, sum of estimates, survivals
    for pair in pairs:
        b = min(int(pair.estimate * bins), bins - 1)
        sums[b][0] += 1
        sums[b][1] += pair.estimate
        sums[b][2] += pair.survived
    return [ReliabilityBin(b / bins, (b + 1) / bins, int(n), total / n if n else None, hits / n if n else None)
            for b, (n, total, hits) in enumerate(sums)]


def expected_calibration_error(table: Sequence[ReliabilityBin]) -> float:
    """`sum_b (n_b / N) |mean estimate_b - observed_b|`; NaN without pairs."""
    total = sum(b.count for b in table)
    if not total:
        return math.nan
    return sum(b.count / total * abs(b.estimated - b.observed) for b in table
               if b.count and b.estimated is not None and b.observed is not None)


@dataclass
class Calibration(Document):
    """The confidence head's estimated prefix survival against the acceptance observed (`eval`'s `calibration`)."""

    KEYS = ("k", "estimate", "definition", "calibrated", "ece", "calibrated_below", "positions", "bins")

    k: int
    positions: list[PositionCalibration]
    bins: list[ReliabilityBin]
    ece: float

    estimate: ClassVar[str] = "s_i = c_0 * ... * c_i, the product of the confidence head's sigmoids up to slot i"
    definition: ClassVar[str] = ("observed: the step accepted its first i + 1 drafts (vLLM's per_position[i]); ECE "
                                 "= sum over the bins of the estimate of (pairs in bin / pairs) x |mean estimate - "
                                 "observed rate|")
    calibrated_below: ClassVar[float] = CALIBRATED_ECE

    @property
    def calibrated(self) -> bool:
        return self.ece <= CALIBRATED_ECE


def calibration_of(pairs: Sequence[Pair], k: int, bins: int = BINS) -> Calibration:
    """The per-position comparison and the reliability table of `pairs`."""
    positions = []
    for i in range(k):
        these = [p for p in pairs if p.position == i]
        if these:
            positions.append(PositionCalibration(
                i, len(these), sum(p.estimate for p in these) / len(these), sum(p.survived for p in these) / len(these),
                expected_calibration_error(reliability(these, bins))))
    table = reliability(pairs, bins)
    return Calibration(k, positions, table, expected_calibration_error(table))


@dataclass
class CalibrationTally:
    """Collects the pairs of one k's verification steps: an `Observer` of `serving.measure_lanes`. A step whose
    drafts carry no confidence (a draft without the head) is not counted; `missing` says how many."""

    k: int
    pairs: list[Pair] = field(default_factory=list)
    missing: int = 0

    def __call__(self, k: int, rollout: Rollout, p: int, drafts: Sequence[int], accepted: int) -> None:
        if k != self.k:
            return
        confidence = getattr(drafts, "confidence", None)
        if confidence is None:
            self.missing += 1
            return
        self.pairs.extend(pairs_of_step(confidence[:k], accepted))

    def result(self) -> Calibration | None:
        return calibration_of(self.pairs, self.k) if self.pairs else None
