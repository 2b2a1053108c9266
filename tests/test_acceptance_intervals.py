"""Intervals for acceptance over prompts x samples (`train.evaluation.acceptance_intervals`), on synthetic counts.

The synthetic measurements have a known truth: each prompt has its own acceptance rate (drawn from a
fixed population of prompts), each of its samples a random number of drafts, and the accepted counts
at position i are binomial with rate**(i + 1). Coverage is counted over 1,000 seeded replications.
"""

from __future__ import annotations

import math

import pytest
import torch

from dspark_hub.train.evaluation.acceptance_intervals import (
    acceptance_intervals,
    paired_difference,
    ratio_interval,
    samples_for_half_width,
    student_t_quantile,
)

K = 3
POPULATION = 0.35 + 0.5 * torch.rand(200, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
#: The population's acceptance length: drafts are independent of the rate, so 1 + sum_i E[rate**(i+1)].
TRUE_AL = 1 + sum(float((POPULATION ** (i + 1)).mean()) for i in range(K))
REPLICATIONS = 1000


def measure(g: torch.Generator, rates: torch.Tensor, samples: int, shift: float = 0.0):
    """`[prompt][sample]` drafts and `[prompt][sample][i]` accepted counts for these prompts' rates."""
    drafts = torch.randint(5, 40, (len(rates), samples), generator=g).double()
    per_position = [torch.binomial(drafts, ((rates - shift) ** (i + 1))[:, None].expand_as(drafts), generator=g)
                    for i in range(K)]
    accepted = torch.stack(per_position, dim=-1)
    return drafts.tolist(), accepted.tolist()


def draw_prompts(g: torch.Generator, n: int) -> torch.Tensor:
    return POPULATION[torch.randint(len(POPULATION), (n,), generator=g)]


def al_interval_ignoring_prompts(drafts, accepted):
    """Broken twin: every request its own cluster, as if samples of one prompt were independent."""
    flat_drafts = [[d] for row in drafts for d in row]
    flat_totals = [[sum(a)] for row in accepted for a in row]
    return ratio_interval(flat_totals, flat_drafts).shifted(1.0)


@pytest.mark.parametrize(("df", "quantile"), [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (19, 2.0930),
                                               (39, 2.0227), (120, 1.9799)])
def test_student_t_quantiles_match_the_table(df, quantile):
    assert student_t_quantile(0.975, df) == pytest.approx(quantile, abs=1e-4)
    assert student_t_quantile(0.025, df) == pytest.approx(-quantile, abs=1e-4)


def coverage(interval_of, truth_of, samples: int, prompts: int = 20, seed: int = 1) -> float:
    g = torch.Generator().manual_seed(seed)
    hits = 0
    for _ in range(REPLICATIONS):
        rates = draw_prompts(g, prompts)
        drafts, accepted = measure(g, rates, samples)
        interval = interval_of(drafts, accepted)
        hits += interval.low <= truth_of(rates) <= interval.high
    return hits / REPLICATIONS


def test_the_interval_over_prompts_covers_the_population_value_and_ignoring_prompts_does_not():
    def over_prompts(drafts, accepted):
        return acceptance_intervals(drafts, accepted).acceptance_length

    assert 0.93 <= coverage(over_prompts, lambda _: TRUE_AL, samples=4) <= 0.97
    assert coverage(al_interval_ignoring_prompts, lambda _: TRUE_AL, samples=4) < 0.8


def test_the_interval_over_samples_covers_these_prompts_value():
    def over_samples(drafts, accepted):
        return acceptance_intervals(drafts, accepted, over="samples").acceptance_length

    def these_prompts(rates):
        return 1 + sum(float((rates ** (i + 1)).mean()) for i in range(K))

    assert 0.93 <= coverage(over_samples, these_prompts, samples=4) <= 0.97
    # the prompts' spread is no part of it: over samples it misses the population value more often
    assert coverage(over_samples, lambda _: TRUE_AL, samples=4) < 0.6


def test_per_position_intervals_use_each_positions_counts():
    drafts = [[10, 10], [10, 10]]
    accepted = [[[8, 4, 2], [6, 3, 1]], [[7, 5, 2], [9, 4, 3]]]
    result = acceptance_intervals(drafts, accepted)
    assert [i.estimate for i in result.per_position] == pytest.approx([0.75, 0.4, 0.2])
    assert result.acceptance_length.estimate == pytest.approx(2.35)
    assert result.to_dict()["per_position"][0]["method"].startswith("linearized ratio of totals")
    assert all(i.low < i.estimate < i.high for i in result.per_position)


def paired_rates(seed: int, shift: float, interval_of) -> float:
    """Share of replications whose interval for B - A lies wholly below 0 (B is worse)."""
    g = torch.Generator().manual_seed(seed)
    below = 0
    for _ in range(REPLICATIONS):
        rates = draw_prompts(g, 20)
        drafts_a, accepted_a = measure(g, rates, 4)
        drafts_b, accepted_b = measure(g, rates, 4, shift)
        interval = interval_of(drafts_a, accepted_a, drafts_b, accepted_b)
        below += interval.high < 0
    return below / REPLICATIONS


def paired(drafts_a, accepted_a, drafts_b, accepted_b):
    def totals(accepted):
        return [[sum(a) for a in row] for row in accepted]
    return paired_difference(totals(accepted_a), drafts_a, totals(accepted_b), drafts_b)


def unpaired(drafts_a, accepted_a, drafts_b, accepted_b):
    """Broken twin: the two measurements' intervals combined as if they shared nothing."""
    a = acceptance_intervals(drafts_a, accepted_a).acceptance_length
    b = acceptance_intervals(drafts_b, accepted_b).acceptance_length
    half = math.hypot(a.half_width, b.half_width)
    diff = b.estimate - a.estimate
    return type(a)(diff, diff - half, diff + half, a.level, "unpaired")


def test_the_paired_difference_rarely_calls_a_draft_worse_than_itself_and_finds_a_real_drop():
    """Same draft, other seed: the gate fires at most ~2.5% of the time (one side of a 95% interval);
    a draft whose acceptance rate is 0.05 lower is caught in nearly every replication, and comparing
    the two measurements as unpaired intervals catches it far less often."""
    assert paired_rates(2, 0.0, paired) <= 0.04
    assert paired_rates(3, 0.05, paired) >= 0.9
    assert paired_rates(3, 0.05, unpaired) < 0.3


def test_samples_for_half_width_predicts_the_width_it_asks_for():
    g = torch.Generator().manual_seed(4)
    rates = draw_prompts(g, 20)
    drafts, accepted = measure(g, rates, 4)
    totals = [[sum(a) for a in row] for row in accepted]
    needed = samples_for_half_width(totals, drafts, 0.05, over="samples")
    assert needed is not None and needed > 4
    widths = []
    for _ in range(20):
        more_drafts, more_accepted = measure(g, rates, needed)
        widths.append(acceptance_intervals(more_drafts, more_accepted, over="samples").acceptance_length.half_width)
    assert 0.04 < sum(widths) / len(widths) < 0.06
    # over prompts, the prompts' own spread (rates 0.35 to 0.85) is wider than +-0.02 at any sample count
    assert samples_for_half_width(totals, drafts, 0.02) is None
    assert samples_for_half_width(totals, drafts, 0.5) == 1


@pytest.mark.parametrize(("call", "words"), [
    (lambda: ratio_interval([[1.0]], [[2.0]]), "2 or more prompts"),
    (lambda: ratio_interval([[1.0], [1.0]], [[2.0], [2.0]], over="samples"), "2 or more samples of every prompt"),
    (lambda: ratio_interval([[0.0, 0.0], [0.0]], [[0.0, 0.0], [0.0]]), "no drafts"),
    (lambda: ratio_interval([[1.0, 1.0]], [[2.0]]), "same prompts and samples"),
    (lambda: ratio_interval([[1.0], [1.0]], [[2.0], [2.0]], over="drafts"), "over must be one of prompts, samples"),
    (lambda: paired_difference([[1.0], [1.0]], [[2.0], [2.0]], [[1.0, 1.0], [1.0]], [[2.0, 2.0], [2.0]]),
     "same prompts and samples"),
    (lambda: acceptance_intervals([[2.0], [2.0]], [[[1.0, 0.0]], [[1.0]]]), "same k"),
])
def test_unusable_measurements_are_refused_in_one_line(call, words):
    with pytest.raises(ValueError, match=words):
        call()
