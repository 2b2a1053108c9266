"""Sampled acceptance as vLLM 0.32.0 verifies drafts (`train.evaluation.sampled_acceptance`), on toy distributions.

Losslessness is a statement about laws: on vocabularies small enough to enumerate every draft,
acceptance and residual branch, the speculative loop's output law equals the target's own sampling
law to 1e-12, and so does the path view `eval` uses. Each rule of the verify step has a broken twin
that one of these checks rejects.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from dspark_hub.errors import UsageError
from dspark_hub.train.evaluation import sampled_acceptance as sa
from dspark_hub.train.evaluation.acceptance import longest_prefix
from dspark_hub.train.evaluation.acceptance_intervals import acceptance_intervals
from tests.sampling_toys import (
    chi_square,
    chi_square_limit,
    direct_block_law,
    distance,
    make_toy,
    path_block_law,
    path_rows,
    speculative_law,
    speculative_sample,
    target_paths,
)

T1 = sa.Sampling(temperature=1.0)
TRUNCATED = sa.Sampling(temperature=0.7, top_k=3, top_p=0.8)
GREEDY = sa.Sampling()
#: (sampling, draft_sample_method): vLLM's default greedy drafting and probabilistic drafting, with and
#: without truncation, and the all-greedy case.
CASES = [(T1, "probabilistic"), (TRUNCATED, "probabilistic"), (T1, "greedy"), (TRUNCATED, "greedy"),
         (sa.Sampling(temperature=1.3, min_p=0.2), "probabilistic"), (GREEDY, "greedy")]


def kept(logits: Sequence[float], sampling: sa.Sampling, process=sa.processed_logits) -> set[int]:
    out = process(torch.tensor([logits], dtype=torch.float64), sampling)[0]
    return {i for i, v in enumerate(out.tolist()) if v > -math.inf}


def logs(*probs: float) -> list[float]:
    return [math.log(p) for p in probs]


# -- the target's distribution: vLLM's order and tie rule ---------------------------------------------

def truncate_then_temperature(logits: torch.Tensor, sampling: sa.Sampling) -> torch.Tensor:
    """Broken twin: top-k/top-p on the raw logits, the temperature after."""
    cut = sa.processed_logits(logits, sa.Sampling(1.0, top_k=sampling.top_k, top_p=sampling.top_p))
    return cut / sampling.temperature


def top_p_then_top_k(logits: torch.Tensor, sampling: sa.Sampling) -> torch.Tensor:
    """Broken twin: top-p over the whole vocabulary, then top-k."""
    cut = sa.processed_logits(logits, sa.Sampling(sampling.temperature, top_p=sampling.top_p))
    return sa.processed_logits(cut * sampling.temperature, sa.Sampling(sampling.temperature, top_k=sampling.top_k))


def top_p_then_min_p(logits: torch.Tensor, sampling: sa.Sampling) -> torch.Tensor:
    """Broken twin: top-p before min-p."""
    cut = sa.processed_logits(logits, sa.Sampling(sampling.temperature, top_p=sampling.top_p))
    return sa.processed_logits(cut * sampling.temperature, sa.Sampling(sampling.temperature, min_p=sampling.min_p))


def min_p_then_temperature(logits: torch.Tensor, sampling: sa.Sampling) -> torch.Tensor:
    """Broken twin: min-p's threshold on the raw logits."""
    return sa.processed_logits(logits, sa.Sampling(1.0, min_p=sampling.min_p)) / sampling.temperature


def top_k_keeping_every_tie(logits: torch.Tensor, sampling: sa.Sampling) -> torch.Tensor:
    """Broken twin (vLLM's PyTorch fallback, not its Triton kernel): every token tied with the k-th stays."""
    x = logits / sampling.temperature
    kth = x.topk(sampling.top_k, dim=-1).values[..., -1:]
    return x.masked_fill(x < kth, -math.inf)


def top_p_keeping_higher_ids(logits: torch.Tensor, sampling: sa.Sampling) -> torch.Tensor:
    """Broken twin (vLLM's PyTorch fallback): an ascending stable sort keeps the higher ids among ties."""
    x = logits / sampling.temperature
    ascending, order = torch.sort(x, dim=-1, stable=True)
    drop = torch.cumsum(torch.softmax(ascending, dim=-1), dim=-1) <= 1 - sampling.top_p
    drop[..., -1] = False
    return torch.empty_like(x).scatter_(-1, order, ascending.masked_fill(drop, -math.inf))


@pytest.mark.parametrize(("logits", "sampling", "want", "twin"), [
    # T = 2 flattens [.5, .3, .2] to [.415, .322, .263]: top-p .45 needs two tokens, on the raw logits one
    (logs(0.5, 0.3, 0.2), sa.Sampling(2.0, top_p=0.45), {0, 1}, truncate_then_temperature),
    # top-k 2 renormalizes [.4, .3] to [.57, .43]: top-p .5 keeps one; top-p first would keep two
    (logs(0.4, 0.3, 0.2, 0.1), sa.Sampling(1.0, top_k=2, top_p=0.5), {0}, top_p_then_top_k),
    # min-p .3 drops both .1s, [.5, .3] renormalizes to [.625, .375]: top-p .6 keeps one
    (logs(0.5, 0.3, 0.1, 0.1), sa.Sampling(1.0, top_p=0.6, min_p=0.3), {0}, top_p_then_min_p),
    # min-p .65 on the tempered [.707, .548, .447] (relative) keeps two; on the raw [.5, .3, .2] one
    (logs(0.5, 0.3, 0.2), sa.Sampling(2.0, min_p=0.65), {0, 1}, min_p_then_temperature),
    # top-k 2 among three tied maxima: exactly two, the lower ids (vLLM's Triton duplicate rule)
    ([1.0, 2.0, 2.0, 2.0, 0.5], sa.Sampling(1.0, top_k=2), {1, 2}, top_k_keeping_every_tie),
    # three tied at .297 each: top-p .5 needs two of them, the lower ids
    ([2.0, 2.0, 2.0, 1.0], sa.Sampling(1.0, top_p=0.5), {0, 1}, top_p_keeping_higher_ids),
])
def test_truncation_follows_vllms_order_and_tie_rule(logits, sampling, want, twin):
    assert kept(logits, sampling) == want
    assert kept(logits, sampling, twin) != want


def test_truncation_keeps_the_fewest_tokens_whose_mass_reaches_p():
    assert kept([0.0] * 6, sa.Sampling(1.0, top_p=0.5)) == {0, 1, 2}          # 3/6 reaches .5 exactly
    assert kept([0.0] * 6, sa.Sampling(1.0, top_p=0.51)) == {0, 1, 2, 3}
    assert kept([0.0] * 6, sa.Sampling(1.0, top_p=1e-9)) == {0}               # never empty
    assert kept([3.0, 1.0], sa.Sampling(1.0, top_k=5)) == {0, 1}              # k >= vocabulary: off
    assert kept([0.0, -math.inf, 1.0, -math.inf], sa.Sampling(1.0, top_k=3)) == {0, 2}   # fewer finite than k


def test_the_greedy_target_is_the_point_mass_at_the_first_maximum():
    probs = sa.target_probs(torch.tensor([0.1, 2.0, 2.0, -1.0]), GREEDY)
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]
    tempered = sa.target_probs(torch.tensor([0.0, math.log(3.0)], dtype=torch.float64), sa.Sampling(0.5))
    assert tempered.tolist() == pytest.approx([0.1, 0.9], abs=1e-15)


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"temperature": -0.5}, "temperature"), ({"temperature": math.nan}, "temperature"),
    ({"temperature": math.inf}, "temperature"), ({"temperature": 1.0, "top_p": 0.0}, "top_p"),
    ({"temperature": 1.0, "top_p": 1.5}, "top_p"), ({"temperature": 1.0, "min_p": -0.1}, "min_p"),
    ({"temperature": 1.0, "min_p": 2.0}, "min_p"), ({"top_k": 5}, "temperature"), ({"top_p": 0.9}, "temperature"),
])
def test_bad_sampling_parameters_name_the_option(kwargs, param):
    with pytest.raises(UsageError, match=f"^{param}: "):
        sa.Sampling(**kwargs)


def test_sampling_describes_what_is_on():
    assert sa.Sampling().describe() == "greedy"
    assert sa.Sampling(1.0).describe() == "temperature 1"
    assert sa.Sampling(0.7, top_k=50, top_p=0.9).describe() == "temperature 0.7, top-p 0.9, top-k 50"


# -- the draft's q --------------------------------------------------------------------------------------

def test_greedy_drafting_is_one_hot_at_every_temperature_and_probabilistic_ignores_truncation():
    logits = torch.tensor([0.5, 1.5, -1.0, 1.0], dtype=torch.float64)
    assert sa.draft_probs(logits, T1, "greedy").tolist() == [0.0, 1.0, 0.0, 0.0]
    q = sa.draft_probs(logits, TRUNCATED, "probabilistic")
    assert torch.allclose(q, torch.softmax(logits / 0.7, dim=-1), rtol=0, atol=1e-15)
    assert bool((q > 0).all())      # top-k 3 and top-p .8 of the target do not touch the draft
    assert sa.draft_probs(logits, GREEDY, "probabilistic").tolist() == [0.0, 1.0, 0.0, 0.0]
    with pytest.raises(UsageError, match=r"^draft_sample_method: 'sampled' is not"):
        sa.draft_probs(logits, T1, "sampled")


def test_drafts_chain_the_markov_head_on_the_drawn_tokens():
    toy = make_toy(3, vocab=5, k=4)
    drafts = sa.draw_drafts(toy.draft(2), toy.k, T1, "probabilistic", sa.make_generator(0, "p", 0, "draft"))
    for i, token in enumerate(drafts.tokens):
        prev = drafts.tokens[i - 1] if i else 2
        want = torch.softmax(toy.base[2, i] + toy.markov[prev], dim=-1)
        assert torch.allclose(drafts.q_rows[i], want, rtol=0, atol=1e-15) and want[token] > 0
    greedy = sa.draw_drafts(toy.draft(2), toy.k, T1, "greedy", torch.Generator())
    assert greedy.tokens == [int(row.argmax()) for row in greedy.q_rows] and bool((greedy.q_rows.sum(-1) == 1).all())


# -- the verify step: losslessness as a law -------------------------------------------------------------

def law_uncapped(p_rows, q_rows, drafts):
    """Broken twin: accepts with p/q, not min(1, p/q)."""
    branches, reach = [], 1.0
    for i, x in enumerate(drafts):
        accept = float(p_rows[i][x] / q_rows[i][x])
        branches.append(sa.Branch(reach * (1 - accept), i, sa.residual(p_rows[i], q_rows[i])))
        reach *= accept
    return [*branches, sa.Branch(reach, len(drafts), p_rows[len(drafts)])]


def law_unnormalized_residual(p_rows, q_rows, drafts):
    """Broken twin: resamples from max(0, p - q) as it is."""
    return [sa.Branch(b.weight, b.accepted, torch.clamp(p_rows[b.accepted] - q_rows[b.accepted], min=0))
            if b.accepted < len(drafts) else b for b in sa.verification_law(p_rows, q_rows, drafts)]


def law_bonus_from_q(p_rows, q_rows, drafts):
    """Broken twin: the bonus token drawn from the draft's q, not the target's p."""
    *branches, bonus = sa.verification_law(p_rows, q_rows, drafts)
    return [*branches, sa.Branch(bonus.weight, bonus.accepted, q_rows[-1])]


def law_error(toy, prefix, sampling, method, law=sa.verification_law) -> float:
    """How far a verify rule is from lossless speculative decoding: the law of the first 3 tokens against
    the target's own, and one step's joint law of (accepted count, tokens) against the path view's."""
    want = {path: w for w, path in target_paths(toy, prefix, 3, sampling)}
    return max(distance(speculative_law(toy, prefix, 3, sampling, method, law), want),
               distance(direct_block_law(toy, prefix, sampling, method, law),
                        path_block_law(toy, prefix, sampling, method)))


@pytest.mark.parametrize(("sampling", "method"), CASES)
def test_the_speculative_loop_emits_the_targets_own_law(sampling, method):
    toy = make_toy(0)
    for prefix in ([1], [3, 0]):
        assert law_error(toy, prefix, sampling, method) < 1e-12


@pytest.mark.parametrize(("twin", "method"), [
    (law_uncapped, "probabilistic"),            # a one-hot q never exceeds p, so greedy drafting cannot tell
    (law_unnormalized_residual, "probabilistic"), (law_unnormalized_residual, "greedy"),
    (law_bonus_from_q, "probabilistic"), (law_bonus_from_q, "greedy"),
])
def test_each_broken_verify_rule_fails_the_law_check(twin, method):
    """Accepting with p/q uncapped still emits p's tokens (as a signed law) but miscounts acceptance."""
    assert law_error(make_toy(0), [1], T1, method, twin) > 1e-3


@pytest.mark.parametrize(("twin", "rejected"), [(None, False), (law_bonus_from_q, True)])
def test_sampled_runs_pass_a_chi_square_test_against_the_targets_law(twin, rejected):
    """2,500 seeded runs of the first two tokens (16 outcomes, 12 or more expected in each), chi-square at
    0.001 false alarms. With k = 1 the second token is the bonus whenever the draft is accepted, so the
    twin that draws it from q is rejected."""
    toy = make_toy(1, k=1, likeness=1.0, scale=1.0)
    verify = sa.verify_block if twin is None else lambda p, q, d, g: _verify_from_law(twin, p, q, d, g)
    law = {path: w for w, path in target_paths(toy, [2], 2, T1)}
    runs = 2500
    counts = Counter(speculative_sample(toy, [2], 2, T1, "probabilistic", sa.make_generator(7, "toy", s, "verify"),
                                        verify) for s in range(runs))
    assert (chi_square(counts, law, runs) > chi_square_limit(len(law) - 1)) == rejected


def _verify_from_law(law, p_rows, q_rows, drafts, generator):
    branches = law(p_rows, q_rows, drafts)
    pick = sa.sample_token(torch.tensor([b.weight for b in branches], dtype=torch.float64), generator)
    branch = branches[pick]
    return branch.accepted, [*drafts[:branch.accepted], sa.sample_token(branch.next_token, generator)]


# -- the path view: the same law from target-sampled paths ----------------------------------------------

@pytest.mark.parametrize(("sampling", "method"), CASES)
def test_the_path_view_has_the_direct_loops_joint_law_of_tokens_and_acceptance(sampling, method):
    for seed, prefix in ((0, [1]), (2, [0, 3]), (5, [2, 2])):
        toy = make_toy(seed, k=3)
        assert distance(path_block_law(toy, prefix, sampling, method),
                        direct_block_law(toy, prefix, sampling, method)) < 1e-12


def first_accepted_law(toy, prefix, sampling, method) -> list[float]:
    """P(the first i + 1 drafts are accepted), i < k, from the direct loop's exact law."""
    law = direct_block_law(toy, prefix, sampling, method)
    return [sum(w for (j, _), w in law.items() if j > i) for i in range(toy.k)]


def overlap_product(block: sa.PathBlock) -> torch.Tensor:
    """Broken twin of `expected_prefix`: the overlaps alone, multiplied along the path."""
    return torch.cumprod(block.overlap, dim=-1)


@pytest.mark.parametrize(("sampling", "method"), CASES[:4])
def test_the_expected_acceptance_along_paths_is_unbiased_and_the_overlap_product_is_not(sampling, method):
    toy = make_toy(12, k=3, likeness=1.0)
    prefix = [0, 2]
    want = torch.tensor(first_accepted_law(toy, prefix, sampling, method), dtype=torch.float64)
    assert want.min() > 0.02                   # every position has something to get right
    paths = target_paths(toy, prefix, toy.k, sampling)
    blocks = [(w, path_rows(toy, prefix, path, sampling, method)) for w, path in paths]
    assert torch.allclose(sum(w * sa.expected_prefix(b) for w, b in blocks), want, rtol=0, atol=1e-12)
    assert (sum(w * overlap_product(b) for w, b in blocks) - want).abs().max() > 1e-3


@pytest.mark.parametrize(("sampling", "method"), [(GREEDY, "greedy"), (GREEDY, "probabilistic"), (T1, "greedy")])
def test_greedy_through_the_path_view_reproduces_the_longest_prefix_count(sampling, method):
    """At temperature 0, and with vLLM's greedy drafting at any temperature, acceptance is a comparison:
    whatever the uniforms, the count is today's `longest_prefix` of the greedy chain against the path."""
    g = torch.Generator().manual_seed(11)
    for trial in range(30):
        toy = make_toy(100 + trial, vocab=3, k=4, likeness=2.0)
        paths = target_paths(toy, [1], toy.k, sampling)            # one path when greedy
        path = list(paths[int(torch.randint(len(paths), (), generator=g))][1])
        block = path_rows(toy, [1], path, sampling, method)
        count = int(sa.accepted_count(block.acceptance, torch.rand(toy.k, generator=g, dtype=torch.float64)))
        chained = sa.draw_drafts(toy.draft(1), toy.k, sampling, method, g).tokens
        assert count == longest_prefix(chained, path)
        p_of_draft = [float(sa.target_probs(toy.target_logits([1, *path[:i]]), sampling)[chained[i]])
                      for i in range(toy.k)]
        assert sa.expected_prefix(block).tolist() == [p_of_draft[i] if i <= count else 0.0 for i in range(toy.k)]


def run_on_path(toy, prompt, path, uniforms, sampling, method):
    """The path view's loop over one sampled path: (drafts, accepted_per_position, expected_per_position)."""
    drafts, accepted, expected = 0, [0] * toy.k, [0.0] * toy.k
    t = 0
    while t + toy.k < len(path):
        block = path_rows(toy, [*prompt, *path[:t]], path[t:], sampling, method)
        j = int(sa.accepted_count(block.acceptance, uniforms[t:t + toy.k]))
        drafts += 1
        accepted = [a + (i < j) for i, a in enumerate(accepted)]
        expected = [e + float(x) for e, x in zip(expected, sa.expected_prefix(block), strict=True)]
        t += j + 1
    return drafts, accepted, expected


def sample_path(toy, prompt, length, sampling, generator):
    path: list[int] = []
    for _ in range(length):
        path.append(sa.sample_token(sa.target_probs(toy.target_logits([*prompt, *path]), sampling), generator))
    return path


def test_the_expected_acceptance_length_lies_in_the_monte_carlo_interval():
    """12 prompts x 6 samples x 24 tokens on a toy: the expected AL (low variance) inside the counts'
    95% interval, and its own interval narrower."""
    toy = make_toy(6, vocab=5, k=3, likeness=1.0)
    sampling = sa.Sampling(0.9, top_p=0.95)
    drafts, accepted, expected = [], [], []
    for prompt_index in range(12):
        prompt = [prompt_index % 5, prompt_index // 5]
        rows = []
        for sample in range(6):
            path = sample_path(toy, prompt, 24, sampling, sa.make_generator(3, str(prompt), sample, "path"))
            rows.append(run_on_path(toy, prompt, path, sa.acceptance_uniforms(3, str(prompt), sample, 24),
                                    sampling, "probabilistic"))
        drafts.append([r[0] for r in rows])
        accepted.append([r[1] for r in rows])
        expected.append([r[2] for r in rows])
    counted = acceptance_intervals(drafts, accepted).acceptance_length
    smooth = acceptance_intervals(drafts, expected).acceptance_length
    assert counted.low <= smooth.estimate <= counted.high
    assert smooth.half_width < counted.half_width


# -- streams and refusals -------------------------------------------------------------------------------

def test_streams_are_reproducible_and_separate():
    assert sa.stream_seed(1, "abc", 0, "path") == sa.stream_seed(1, "abc", 0, "path") < 2**63
    seeds = {sa.stream_seed(*args) for args in [(1, "abc", 0, "path"), (2, "abc", 0, "path"), (1, "abd", 0, "path"),
                                                (1, "abc", 1, "path"), (1, "abc", 0, "accept")]}
    assert len(seeds) == 5
    assert torch.equal(sa.acceptance_uniforms(1, "abc", 2, 10), sa.acceptance_uniforms(1, "abc", 2, 10))
    assert sa.acceptance_uniforms(1, "abc", 2, 10)[:4].tolist() == sa.acceptance_uniforms(1, "abc", 2, 4).tolist()
    with pytest.raises(ValueError, match="'coins' is not one of path, accept, draft, verify"):
        sa.stream_seed(1, "abc", 0, "coins")


def test_impossible_tokens_are_refused():
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)
    with pytest.raises(ValueError, match="draft token 0 has probability 0 under the draft's own q"):
        sa.accept_probability(p, q, 0)
    with pytest.raises(ValueError, match="path token has probability 0 under the target's p"):
        sa.path_block(p[None], q[None], torch.tensor([2]))
    assert sa.residual(p, p).tolist() == p.tolist()
    assert sa.residual(p, q).tolist() == [1.0, 0.0, 0.0]
