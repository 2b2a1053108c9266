"""95% intervals for acceptance numbers measured over prompts x samples, and paired differences.

vLLM's acceptance length is a ratio of totals, `1 + sum(accepted) / sum(drafts)`, and so is each
per-position rate. The unit of measurement is one (prompt, sample): a request, with its own number of
drafts. Samples of one prompt are correlated (same prompt, same kind of text), prompts are not.

The interval is the linearized (delta-method) ratio estimator with prompts as clusters, and a Student t
quantile with `prompts - 1` degrees of freedom: each unit's score is `(accepted - R * drafts) / total
drafts`, the estimate's error is their sum to first order, and its variance is estimated from the
prompts' summed scores (`n / (n - 1) * sum c_i**2`). Why this one:

- it keeps vLLM's estimand: a mean of per-prompt acceptance lengths would weigh a prompt with 3 drafts
  as much as one with 60 and is a different number;
- clustering by prompt makes it valid whatever the correlation between samples of a prompt, and it
  covers both sources of spread (which prompts, which random draws) in one number;
- it is closed-form, deterministic (no resampling seed) and O(units), and a paired difference of two
  measurements on the same prompts is the same computation on the difference of their scores.

`over="samples"` holds the prompts fixed and counts only the spread between samples of a prompt
(each prompt needs 2 or more samples): the interval for "these prompts, another seed", e.g. a
simulation against an engine run on the same prompts. tests/test_acceptance_intervals.py checks
the coverage of both on clustered data, against an interval that ignores the clustering.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from dspark_hub.documents import Document

#: `[prompt][sample]` one number per unit (drafts, or accepted tokens at a position, or their sum).
Units = Sequence[Sequence[float]]
OVER = ("prompts", "samples")
METHOD = ("linearized ratio of totals (delta method), {over} as the unit, Student t with {df} degrees of "
          "freedom")


@dataclass(frozen=True)
class Interval(Document):
    estimate: float
    low: float
    high: float
    level: float
    method: str

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def shifted(self, by: float) -> Interval:
        return Interval(self.estimate + by, self.low + by, self.high + by, self.level, self.method)


@dataclass(frozen=True)
class AcceptanceIntervals(Document):
    acceptance_length: Interval
    per_position: list[Interval]


def _regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) by its continued fraction (modified Lentz), x in [0, 1]."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):                    # the fraction converges fast only below the mean
        return 1.0 - _regularized_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * result


def student_t_cdf(x: float, df: float) -> float:
    tail = 0.5 * _regularized_beta(df / 2, 0.5, df / (df + x * x))
    return 1.0 - tail if x >= 0 else tail


@functools.lru_cache(maxsize=256)
def student_t_quantile(probability: float, df: float) -> float:
    """The t quantile (bisection on `student_t_cdf`; 12.7062 for 0.975 at 1 degree of freedom)."""
    if not 0 < probability < 1 or df <= 0:
        raise ValueError(f"student_t_quantile: probability {probability} and df {df} must be in (0, 1) and > 0")
    if probability < 0.5:
        return -student_t_quantile(1 - probability, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < probability:
        high *= 2
    while high - low > 1e-12 * high:
        mid = (low + high) / 2
        low, high = (mid, high) if student_t_cdf(mid, df) < probability else (low, mid)
    return (low + high) / 2


def _check_shape(numerator: Units, denominator: Units) -> None:
    if [len(row) for row in numerator] != [len(row) for row in denominator]:
        raise ValueError("the numerator and denominator must have the same prompts and samples")


def _scores(numerator: Units, denominator: Units) -> tuple[float, list[list[float]]]:
    """The ratio of totals and each unit's linearized score (they sum to 0)."""
    _check_shape(numerator, denominator)
    total = sum(sum(row) for row in denominator)
    if total <= 0:
        raise ValueError("no drafts: a ratio over zero drafts has no interval")
    ratio = sum(sum(row) for row in numerator) / total
    return ratio, [[(n - ratio * d) / total for n, d in zip(nums, dens, strict=True)]
                   for nums, dens in zip(numerator, denominator, strict=True)]


def _spread(scores: Sequence[Sequence[float]], over: str) -> tuple[float, int]:
    """(variance of the summed scores, degrees of freedom) with `over` as the unit."""
    if over == "prompts":
        n = len(scores)
        if n < 2:
            raise ValueError("an interval over prompts needs 2 or more prompts")
        sums = [sum(row) for row in scores]
        mean = sum(sums) / n
        return n / (n - 1) * sum((c - mean) ** 2 for c in sums), n - 1
    if over == "samples":
        if any(len(row) < 2 for row in scores):
            raise ValueError("an interval over samples needs 2 or more samples of every prompt")
        variance = 0.0
        for row in scores:
            mean = sum(row) / len(row)
            variance += len(row) / (len(row) - 1) * sum((z - mean) ** 2 for z in row)
        return variance, sum(len(row) - 1 for row in scores)
    raise ValueError(f"over must be one of {', '.join(OVER)}, not {over!r}")


def _interval(estimate: float, variance: float, df: int, level: float, over: str) -> Interval:
    if not 0 < level < 1:
        raise ValueError(f"level {level} must be in (0, 1)")
    half = student_t_quantile((1 + level) / 2, df) * math.sqrt(variance)
    return Interval(estimate, estimate - half, estimate + half, level, METHOD.format(over=over, df=df))


def ratio_interval(numerator: Units, denominator: Units, *, level: float = 0.95, over: str = "prompts") -> Interval:
    """Interval for `sum(numerator) / sum(denominator)` over `[prompt][sample]` units (module docstring)."""
    ratio, scores = _scores(numerator, denominator)
    variance, df = _spread(scores, over)
    return _interval(ratio, variance, df, level, over)


def acceptance_intervals(drafts: Units, accepted: Sequence[Sequence[Sequence[float]]], *, level: float = 0.95,
                         over: str = "prompts") -> AcceptanceIntervals:
    """Intervals for the acceptance length and each per-position rate.

    Args:
        drafts: `[prompt][sample]` drafts of each request.
        accepted: `[prompt][sample][i]` its `accepted_per_position` (counts, or expected counts).
    """
    positions = {len(row) for sample in accepted for row in sample}
    if len(positions) != 1:
        raise ValueError("every request's accepted_per_position must have the same k")
    k = positions.pop()
    totals = [[sum(row) for row in sample] for sample in accepted]
    return AcceptanceIntervals(
        acceptance_length=ratio_interval(totals, drafts, level=level, over=over).shifted(1.0),
        per_position=[ratio_interval([[row[i] for row in sample] for sample in accepted], drafts, level=level,
                                     over=over) for i in range(k)])


def paired_difference(numerator_a: Units, denominator_a: Units, numerator_b: Units, denominator_b: Units, *,
                      level: float = 0.95, over: str = "prompts") -> Interval:
    """Interval for `ratio_b - ratio_a`, two measurements of the same `[prompt][sample]` units.

    Each unit's score difference carries the pairing: what the two share (the prompt, and with common
    random numbers the sampled path) cancels. The measurements must have the same prompts and samples.
    """
    _check_shape(numerator_a, numerator_b)
    ratio_a, scores_a = _scores(numerator_a, denominator_a)
    ratio_b, scores_b = _scores(numerator_b, denominator_b)
    differences = [[b - a for a, b in zip(row_a, row_b, strict=True)]
                   for row_a, row_b in zip(scores_a, scores_b, strict=True)]
    variance, df = _spread(differences, over)
    return _interval(ratio_b - ratio_a, variance, df, level, over)


def samples_for_half_width(numerator: Units, denominator: Units, half_width: float, *, level: float = 0.95,
                           over: str = "prompts") -> int | None:
    """Samples per prompt for an interval of `+- half_width` on these prompts, or None when more samples
    cannot reach it (over prompts, the spread between prompts alone is wider: more prompts are needed).

    A one-way components model of the per-unit scores (prompt effect + sample noise), estimated from
    these units (2 or more samples of every prompt); the t quantile is the current one.
    """
    _, scores = _scores(numerator, denominator)
    units = sum(len(row) for row in scores)
    n = len(scores)
    per_unit = [[z * units for z in row] for row in scores]        # scale-free: the error is their mean
    within, _ = _spread(per_unit, "samples")
    within /= units                                                 # pooled within-prompt variance of a unit
    _, df = _spread(scores, over)
    target = (half_width / student_t_quantile((1 + level) / 2, df)) ** 2 * n
    between = 0.0
    if over == "prompts":
        means = [sum(row) / len(row) for row in per_unit]
        grand = sum(means) / n
        between = max(0.0, sum((m - grand) ** 2 for m in means) / (n - 1) - within / (units / n))
    if target <= between:
        return None
    return max(1, math.ceil(within / (target - between)))
