"""What to serve a draft with, counted in toy worlds (no model): the k sweep, context buckets, calibration.

Each check has its failing twin: a sweep that reads the smaller k off the largest k's drafts and path; a
drafter with a full history beside the one whose window is smaller than the context; a calibration table
that pairs an estimate with the next position's outcome.
"""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest
import torch

from dspark_hub.errors import UsageError
from dspark_hub.train.evaluation.acceptance import AcceptanceStats, VerifyLoop, measure_batched, measure_sweep
from dspark_hub.train.evaluation.by_context import (
    ALL,
    ContextTally,
    automatic_edges,
    bucket_label,
    parse_edges,
)
from dspark_hub.train.evaluation.calibration import (
    CALIBRATED_ECE,
    CalibrationTally,
    Pair,
    calibration_of,
    pairs_of_step,
    prefix_survival,
)
from dspark_hub.train.evaluation.drafters import Drafts, ngram_proposer
from dspark_hub.train.evaluation.serving import MAX_KS, parse_ks
from dspark_hub.train.target.generate import Rollout


def rollout(ids: list[int], prompt_length: int, index: int = 0, dataset: str | None = None) -> Rollout:
    return Rollout(index, dataset, torch.tensor(ids), prompt_length, torch.zeros(0), torch.zeros(0))


# ----------------------------------------------------------------------------- k lists


@pytest.mark.parametrize(("text", "ks"), [("1,2,4", [1, 2, 4]), ("3-5", [3, 4, 5]), ("2-3,7,2", [2, 3, 7]),
                                          ("block", [1, 2, 3, 4, 5]), ("1, 4 - 5", [1, 4, 5])])
def test_a_k_list_reads_as_written(text, ks):
    assert parse_ks(text, block=5) == ks


@pytest.mark.parametrize(("text", "says"), [("0,1", "1 or more"), ("5-3", "runs down"), ("two", "not a k"),
                                            ("1,,x", "not a k"), (f"1-{MAX_KS + 1}", f"at most {MAX_KS}"),
                                            ("", "not a k")])
def test_a_bad_k_list_is_refused_in_one_line(text, says):
    with pytest.raises(UsageError, match=says) as info:
        parse_ks(text, block=5)
    assert "\n" not in str(info.value) and info.value.param == "ks"


# ----------------------------------------------------------------------------- the sweep


def _world(seed: int = 0) -> list[Rollout]:
    """Paths over a 6-token vocabulary with runs, so drafts that copy the path are often right."""
    rng = random.Random(seed)
    out = []
    for index in range(6):
        ids = [rng.randrange(6) for _ in range(5)]
        while len(ids) < 60:
            ids += [ids[-1]] * rng.randrange(1, 5) + [rng.randrange(6)]
        out.append(rollout(ids[:60], 5, index, dataset="runs" if index % 2 else "mixed"))
    return out


def _block_drafter(rollouts: list[Rollout], ks: list[int]) -> dict[int, object]:
    """A block drafter whose block depends on k (as a DSpark block does): the path itself, except that slot
    `(p + k) % k` of a block of k is wrong when p is odd. A block of 7 is not a block of 5 plus two."""
    paths = [r.input_ids.tolist() for r in rollouts]

    def at(k: int):
        def propose_many(requests):
            out = []
            for i, p in requests:
                drafts = (paths[i][p + 1:p + 1 + k] + [99] * k)[:k]
                if p % 2:
                    drafts[(p + k) % k] = 98
                out.append(Drafts.of(drafts, [0.5] * k))
            return out
        return propose_many

    return {k: at(k) for k in ks}


def _counts(stats: AcceptanceStats) -> tuple:
    return stats.drafts, tuple(stats.accepted_per_position), stats.tokens, stats.prompts


def test_every_k_of_a_sweep_counts_what_a_run_at_that_k_alone_counts():
    world, ks = _world(), [1, 2, 3, 5, 7]
    sweep = measure_sweep(world, _block_drafter, ks, max_tokens=40, stop_ids=[5], window=4)
    assert sweep.ks == ks
    for k in ks:
        alone = measure_batched(world, lambda chunk, k=k: _block_drafter(chunk, [k])[k], k, max_tokens=40,
                                stop_ids=[5], window=4)
        assert _counts(sweep.by_k[k].overall) == _counts(alone.overall)
        assert {n: _counts(s) for n, s in sweep.by_k[k].measurement.by_dataset.items()} == \
            {n: _counts(s) for n, s in alone.by_dataset.items()}
    # the counts differ between k, so the equality above tells them apart
    assert len({_counts(sweep.by_k[k].overall) for k in ks}) == len(ks)


def _truncating_sweep(world: list[Rollout], ks: list[int]) -> dict[int, list[int]]:
    """The wrong sweep: the largest k's loops only, each smaller k read off the prefixes of its drafts on its path."""
    top = max(ks)
    counts = {k: [0] * k for k in ks}
    for r in world:
        loop = VerifyLoop(r, top, max_tokens=40, stop_ids=[5])
        propose = _block_drafter([r], [top])[top]
        while (p := loop.anchor) is not None:
            drafts = propose([(0, p)])[0]
            loop.step(drafts)
            accepted = loop.p - p - 1
            for k in ks:
                for i in range(min(accepted, k)):
                    counts[k][i] += 1
    return counts


def test_the_twin_a_sweep_that_reuses_the_largest_ks_drafts_and_path_counts_otherwise():
    world, ks = _world(), [1, 2, 3, 5, 7]
    right = measure_sweep(world, _block_drafter, ks, max_tokens=40, stop_ids=[5])
    wrong = _truncating_sweep(world, ks)
    assert wrong[7] == right.by_k[7].overall.accepted_per_position      # the one k it does measure
    differs = [k for k in ks if wrong[k] != right.by_k[k].overall.accepted_per_position]
    assert differs == [1, 2, 3, 5]


def test_the_per_request_mean_weighs_every_request_alike():
    short, long_ = rollout(_world()[0].input_ids.tolist()[:14], 5), _world()[1]
    sweep = measure_sweep([short, long_], _block_drafter, [3])
    alone = [measure_sweep([r], _block_drafter, [3]).by_k[3].overall for r in (short, long_)]
    assert alone[0].drafts != alone[1].drafts and alone[0].acceptance_length != alone[1].acceptance_length
    mean = (alone[0].acceptance_length + alone[1].acceptance_length) / 2
    assert sweep.by_k[3].per_request_acceptance_length == pytest.approx(mean)
    assert sweep.by_k[3].overall.acceptance_length != pytest.approx(mean)


# ----------------------------------------------------------------------------- by context length


@pytest.mark.parametrize(("text", "edges"), [("1024,4096", [1024, 4096]), ("64", [64]), (" 8, 16 ,32", [8, 16, 32])])
def test_context_edges_read_as_written(text, edges):
    assert parse_edges(text) == edges


@pytest.mark.parametrize("text", ["4096,1024", "64,64", "1,8", "x", "0", ",", "8;16"])
def test_bad_context_edges_are_refused(text):
    with pytest.raises(UsageError, match="context length") as info:
        parse_edges(text)
    assert info.value.param == "context_edges"


def test_automatic_edges_are_powers_of_two_up_to_the_longest_context():
    assert automatic_edges(63) == [] and automatic_edges(64) == [64] and automatic_edges(300) == [64, 128, 256]
    assert (bucket_label(1, 64), bucket_label(1024, None)) == ("1-63", "1,024+")


def _retrieval_world(segments: int = 30, filler: int = 6, pairs: int = 30) -> list[Rollout]:
    """A dictionary of key -> value pairs, then a continuation that asks the keys in order, each after `filler`
    fresh tokens: the answer to a query lies at a fixed place near the start, farther away at every query."""
    keys = list(range(1000, 1000 + pairs))
    values = list(range(2000, 2000 + pairs))
    dictionary = [t for kv in zip(keys, values, strict=True) for t in kv]
    fresh = iter(range(10_000, 100_000))
    ids = list(dictionary)
    for i in range(segments):
        ids += [next(fresh) for _ in range(filler)] + [keys[i], values[i]]
    return [rollout(ids, len(dictionary))]


def _prompt_lookup(window: int | None):
    """Prompt lookup (eval's baseline drafter) over the last `window` tokens only (None: the whole history)."""
    def make(rollouts, ks):
        def at(k):
            def propose_many(requests):
                out = []
                for i, p in requests:
                    ids = rollouts[i].input_ids
                    start = 0 if window is None else max(0, p + 1 - window)
                    view = SimpleNamespace(input_ids=ids[start:])
                    out.append(ngram_proposer(view, k)(p - start))
                return out
            return propose_many
        return {k: at(k) for k in ks}
    return make


def _by_context(window: int | None, edges: list[int]) -> dict[str, float]:
    tally = ContextTally(2, edges)
    measure_sweep(_retrieval_world(), _prompt_lookup(window), [2], observe=tally)
    return {row.context: row.acceptance_length for row in tally.result().rows if row.dataset == ALL}


def test_a_draft_whose_window_is_smaller_than_the_context_falls_off_past_it():
    edges = [96, 128, 160, 192, 224]
    windowed = _by_context(96, edges)          # the dictionary leaves the window after ~96 tokens of context
    full = _by_context(None, edges)            # the twin: the whole history, no cliff
    assert list(windowed) == list(full) == ["1-95", "96-127", "128-159", "160-191", "192-223", "224+"]
    assert max(full.values()) - min(full.values()) < 0.05 and min(full.values()) > 1.1
    assert windowed["1-95"] == pytest.approx(full["1-95"])
    assert windowed["128-159"] == windowed["160-191"] == windowed["192-223"] == windowed["224+"] == 1.0


def test_context_rows_count_every_step_once_per_dataset_and_once_overall():
    world = _world()
    tally = ContextTally(3, [20, 40])
    sweep = measure_sweep(world, _block_drafter, [3, 5], observe=tally)
    result = tally.result()
    overall = [row for row in result.rows if row.dataset == ALL]
    assert sum(row.drafts for row in overall) == sweep.by_k[3].overall.drafts
    assert [sum(x) for x in zip(*(row.accepted_per_position for row in overall), strict=True)] == \
        sweep.by_k[3].overall.accepted_per_position
    for name, stats in sweep.by_k[3].measurement.by_dataset.items():
        assert sum(row.drafts for row in result.rows if row.dataset == name) == stats.drafts


# ----------------------------------------------------------------------------- calibration


#: Per-slot confidence 0.5, 0.9, 0.5: estimated survival 0.5, 0.45, 0.225.
CONFIDENCE = [0.5, 0.9, 0.5]


def _calibrated_steps() -> list[tuple[list[float], int]]:
    """40 steps whose outcomes match the estimates exactly: 20 accept the first draft, 18 the second, 9 all three."""
    return [(CONFIDENCE, 3)] * 9 + [(CONFIDENCE, 2)] * 9 + [(CONFIDENCE, 1)] * 2 + [(CONFIDENCE, 0)] * 20


def test_prefix_survival_is_the_product_of_the_conditionals():
    assert prefix_survival([0.9, 0.5, 0.5]) == pytest.approx([0.9, 0.45, 0.225])
    assert [p.survived for p in pairs_of_step([0.9, 0.5, 0.5], 2)] == [True, True, False]


def test_a_head_whose_estimates_match_the_outcomes_has_no_calibration_error():
    pairs = [pair for confidence, accepted in _calibrated_steps() for pair in pairs_of_step(confidence, accepted)]
    table = calibration_of(pairs, 3)
    assert table.ece == pytest.approx(0.0, abs=1e-12) and table.calibrated
    assert [(p.estimated, p.observed) for p in table.positions] == [pytest.approx((0.5, 0.5)),
                                                                   pytest.approx((0.45, 0.45)),
                                                                   pytest.approx((0.225, 0.225))]


def test_the_twin_a_table_that_compares_the_wrong_positions_finds_error_in_a_calibrated_head():
    shifted = []                 # the estimate of position i against the outcome of position i + 1
    for confidence, accepted in _calibrated_steps():
        pairs = pairs_of_step(confidence, accepted)
        shifted += [Pair(a.position, a.estimate, b.survived) for a, b in itertools.pairwise(pairs)]
    conditional = [Pair(p.position, c, p.survived)     # the conditional estimate c_i against prefix survival
                   for confidence, accepted in _calibrated_steps()
                   for p, c in zip(pairs_of_step(confidence, accepted), confidence, strict=True)]
    assert calibration_of(shifted, 3).ece == pytest.approx(0.1375)
    assert calibration_of(conditional, 3).ece == pytest.approx(29 / 120)
    assert min(calibration_of(shifted, 3).ece, calibration_of(conditional, 3).ece) > CALIBRATED_ECE


def test_the_tally_pairs_each_steps_confidence_with_its_own_acceptance():
    world = _world()
    tally = CalibrationTally(3)
    sweep = measure_sweep(world, _block_drafter, [3, 4], observe=tally)
    result = tally.result()
    assert result is not None and result.k == 3
    assert [p.observed for p in result.positions] == pytest.approx(sweep.by_k[3].overall.per_position)
    assert [p.drafts for p in result.positions] == [sweep.by_k[3].overall.drafts] * 3
    assert [p.estimated for p in result.positions] == pytest.approx([0.5, 0.25, 0.125])


def test_drafts_without_a_confidence_make_no_table():
    tally = CalibrationTally(2)
    tally(2, rollout([1, 2, 3], 1), 1, [1, 2], 1)
    assert tally.result() is None and tally.missing == 1
