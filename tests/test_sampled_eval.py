"""`eval --temperature`: sampled target paths, the verify loop on them, units, intervals and expected numbers.

The rules themselves (vLLM's processing order, rejection sampling, the path view, the unbiased expected
number) are tested on enumerable toys in tests/test_sampled_acceptance.py; here they run on the real eval
path: the specdec fixtures (a tiny Qwen3 target and a speculators DSpark trained on it), 8 prompts.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError
from dspark_hub.train.evaluation import sampled_acceptance as sa
from dspark_hub.train.evaluation.acceptance import AcceptanceStats
from dspark_hub.train.evaluation.decoding import GREEDY, eval_sampling
from dspark_hub.train.evaluation.evaluate import evaluate
from dspark_hub.train.evaluation.paths import PathDraws, PathTarget, Unit, prompt_key, sampled_prompts
from dspark_hub.train.evaluation.sampled_eval import _Path, _verify_round
from dspark_hub.train.target.generate import Prompt
from tests.sampling_toys import chi_square, chi_square_limit

SPECDEC = Path(__file__).parent / "fixtures" / "specdec"
DRAFT, TARGET, PROMPTS = SPECDEC / "dspark", SPECDEC / "target", SPECDEC / "prompts.jsonl"
#: A temperature at which the fixtures' random target is not flat (its logits are small: at 1.0 every draft
#: is accepted about 1% of the time); the real model is measured at 0.7 and 1.0 (docs/real-model.md).
T = 0.3


def run_eval(**options):
    return evaluate(DRAFT, target=str(TARGET), prompts=str(PROMPTS), max_new_tokens=6, **options).to_dict()


def summed(units: list[dict], key: str) -> list[float]:
    return [sum(u[key][i] for u in units) for i in range(len(units[0][key]))]


@pytest.fixture(scope="module")
def greedy() -> dict:
    return run_eval()


@pytest.fixture(scope="module")
def sampled() -> dict:
    return run_eval(sampling=eval_sampling(T, samples=2, seed=3))


def test_a_greedy_eval_carries_its_units_and_its_counts_are_the_expected_numbers(greedy):
    assert greedy["schema"] == "dspark-hub/eval/3"
    assert greedy["sampling"]["describe"] == "greedy" and greedy["sampling"]["samples"] == 1
    units = greedy["units"]
    assert len(units) == 8 and {u["sample"] for u in units} == {0}
    assert len({u["prompt_key"] for u in units}) == 8
    assert sum(u["drafts"] for u in units) == greedy["drafts"]
    assert summed(units, "accepted_per_position") == greedy["accepted_per_position"]
    # greedy: the expected acceptance is the count itself, and says so
    assert summed(units, "expected_per_position") == greedy["accepted_per_position"]
    assert greedy["expected"]["acceptance_length"] == greedy["acceptance_length"]
    assert greedy["expected"]["label"].startswith("greedy")
    assert greedy["intervals"]["prompts"] == 8 and greedy["intervals"]["samples_for_half_width_0.02"] is None
    assert greedy["harness"]["decoding"] == "greedy" and greedy["harness"]["temperature"] == 0.0


def test_a_sampled_eval_measures_every_prompt_and_sample(sampled):
    units = sampled["units"]
    assert [(u["prompt_index"], u["sample"]) for u in units] == [(i, s) for i in range(8) for s in range(2)]
    assert sampled["prompts"] == 8                   # prompts, not requests
    assert sum(u["drafts"] for u in units) == sampled["drafts"]
    assert summed(units, "accepted_per_position") == sampled["accepted_per_position"]
    expected = summed(units, "expected_per_position")
    assert expected != sampled["accepted_per_position"]            # probabilities, not counts
    assert sampled["expected"]["per_position"] == pytest.approx([e / sampled["drafts"] for e in expected])
    assert "not a count" in sampled["expected"]["label"]
    interval = sampled["intervals"]["acceptance_length"]
    assert interval["low"] <= sampled["acceptance_length"] <= interval["high"]
    assert sampled["intervals"]["units"] == 16 and sampled["intervals"]["over"] == "prompts"
    assert sampled["harness"]["decoding"] == "sampled" and sampled["harness"]["temperature"] == T
    assert sampled["sampling"] == {"temperature": T, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                                   "draft_sample_method": "greedy", "samples": 2, "seed": 3,
                                   "describe": f"temperature {T}; greedy drafting; 2 samples a prompt (seed 3)"}


@pytest.mark.slow
def test_a_seed_gives_the_same_paths_and_another_seed_other_ones(sampled):
    again = run_eval(sampling=eval_sampling(T, samples=2, seed=3))
    other = run_eval(sampling=eval_sampling(T, samples=2, seed=4))
    assert again["units"] == sampled["units"]
    assert [u["expected_per_position"] for u in other["units"]] != [u["expected_per_position"]
                                                                     for u in sampled["units"]]


def test_the_sampled_paths_are_the_targets_samples_not_its_greedy_path(greedy, sampled):
    """At T = 0.3 the draft, trained on the greedy path, loses acceptance on sampled paths."""
    assert sampled["acceptance_length"] < greedy["acceptance_length"]


# -- the draw rule: vLLM's distribution, one stream per unit ----------------------------------------------

def _units(n: int) -> list[Unit]:
    return [Unit(i, prompt_key([i]), None, 0) for i in range(n)]


def test_a_units_draws_do_not_depend_on_its_batch():
    settings = eval_sampling(1.0, seed=5)
    scores = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    prompts = [Prompt(i, [1, 2, 3]) for i in range(3)]

    def draws(order: list[int]) -> dict[int, list[int]]:
        rule = PathDraws(_units(3), settings)
        step = rule([prompts[i] for i in order])
        out: dict[int, list[int]] = {i: [] for i in order}
        for _ in range(4):
            for i, token in zip(order, step(scores[order]).tolist(), strict=True):
                out[i].append(token)
        return out

    assert draws([0, 1, 2]) == draws([2, 0, 1]) == {**draws([1]), **draws([0, 2])}


def test_the_draw_rule_samples_vllms_distribution_and_records_it():
    settings = eval_sampling(0.8, top_k=3, top_p=0.9, seed=1)
    logits = torch.tensor([[2.0, 1.5, 1.5, 0.2, -1.0]])
    rule = PathDraws([Unit(0, "k", None, s) for s in range(1)], settings)
    step = rule([Prompt(0, [9])])
    counts = Counter(int(step(logits)[0]) for _ in range(3000))
    target = rule.targets[0]
    processed = sa.processed_logits(logits[0], settings.sampling)
    assert target.log_norm[0] == pytest.approx(float(torch.logsumexp(processed, dim=-1)))
    assert target.kept is not None and target.kept[0].tolist() == [0, 1, 2][:len(target.kept[0])]
    law = {x: float(p) for x, p in enumerate(sa.target_probs(logits[0], settings.sampling)) if p > 0}
    assert set(counts) <= set(law) and chi_square(counts, law, 3000) < chi_square_limit(len(law) - 1)
    uniform = {x: 1 / len(law) for x in law}                        # the twin: not the target's law
    assert chi_square(counts, uniform, 3000) > chi_square_limit(len(law) - 1)


# -- verification on a path ------------------------------------------------------------------------------

def _path(tokens: list[int], logits: torch.Tensor, settings, start: int = 1) -> tuple[_Path, torch.Tensor]:
    """A path whose final state at t is one-hot at t, so the logits at t are row t of `logits` (the lm_head)."""
    final = torch.eye(len(tokens), logits.shape[0])
    lm_head = logits.T.contiguous()                       # [V, positions]: logit of x at t = lm_head[x, t]
    processed = sa.processed_logits(logits[start - 1:len(tokens) - 1], settings.sampling)
    target = PathTarget(start, torch.logsumexp(processed, dim=-1).tolist(),
                        [torch.isfinite(row).nonzero().flatten() for row in processed]
                        if settings.sampling.truncated else None)
    return _Path(tokens, final, target, Unit(0, "key", None, 0)), lm_head


def test_greedy_drafting_counts_the_match_and_expects_the_targets_probability_of_each_draft():
    settings = eval_sampling(0.7, seed=0)
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(2))    # 6 positions, vocabulary 5
    tokens = [0, 3, 1, 4, 2, 2]
    path, lm_head = _path(tokens, logits, settings)
    drafts = [1, 4, 0]                                     # positions 2..4: matches 1, 4, then misses
    (accepted, expected), = _verify_round([path], [(0, 1)], [drafts], 3, lm_head, settings)
    p = [sa.target_probs(logits[t - 1], settings.sampling) for t in (2, 3, 4)]
    assert accepted == 2
    assert expected == pytest.approx([float(p[0][1]), float(p[1][4]), float(p[2][0])])
    # a miss at the first draft: only its own probability counts, nothing after it
    (accepted, expected), = _verify_round([path], [(0, 1)], [[2, 4, 2]], 3, lm_head, settings)
    assert (accepted, expected) == (0, pytest.approx([float(p[0][2]), 0.0, 0.0]))


def test_a_token_truncation_removed_is_never_accepted_in_expectation():
    settings = eval_sampling(1.0, top_k=2, seed=0)
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 3.0, 2.0, 1.0], [1.0, 0.0, 3.0, 2.0]])
    path, lm_head = _path([0, 0, 1, 2], logits, settings)
    (_, expected), = _verify_round([path], [(0, 0)], [[3, 1]], 2, lm_head, settings)
    assert expected == [0.0, 0.0]                          # 3 is outside the top 2 at position 1
    (_, kept), = _verify_round([path], [(0, 0)], [[1, 2]], 2, lm_head, settings)
    assert kept[0] == pytest.approx(math.exp(2.0) / (math.exp(3.0) + math.exp(2.0)))


def test_probabilistic_drafting_is_the_path_view_of_vllms_rejection_sampler():
    settings = eval_sampling(0.9, draft_sample_method="probabilistic", seed=0)
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 5, generator=g)
    q_logits = torch.randn(3, 5, generator=g)
    tokens = [0, 3, 1, 4, 2, 2]
    path, lm_head = _path(tokens, logits, settings)
    (accepted, expected), = _verify_round([path], [(0, 1)], [q_logits], 3, lm_head, settings)
    p_rows = torch.stack([sa.target_probs(logits[t - 1], settings.sampling) for t in (2, 3, 4)]).double()
    q_rows = sa.draft_probs(q_logits.double(), settings.sampling, "probabilistic")
    block = sa.path_block(p_rows, q_rows, torch.tensor(tokens[2:5]))
    assert expected == pytest.approx(sa.expected_prefix(block).tolist(), rel=1e-5)
    uniforms = sa.acceptance_uniforms(0, "key", 0, len(tokens))[2:5]
    assert accepted == int(sa.accepted_count(block.acceptance, uniforms))


# -- what eval refuses ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "says"), [
    (["--samples", "4"], "greedy decoding has one path a prompt"),
    (["--draft-sample-method", "probabilistic"], "the drafting method needs a temperature"),
    (["--top-p", "0.9"], "top-k, top-p and min-p need a temperature above 0"),
    (["--top-k", "5"], "top-k, top-p and min-p need a temperature above 0"),
    (["--temperature", "1", "--data", str(SPECDEC)], "a rollouts folder holds greedy paths"),
])
def test_what_a_sampled_eval_cannot_mean_is_refused_in_one_line(args, says):
    base = ["eval", "--draft", str(DRAFT), "--target", str(TARGET)]
    result = CliRunner().invoke(cli, [*base, *([] if "--data" in args else ["--prompts", str(PROMPTS)]), *args])
    assert result.exit_code == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_greedy_is_the_default_and_a_temperature_defaults_to_two_samples():
    assert eval_sampling() is GREEDY
    sampled = eval_sampling(1.0)
    assert (sampled.samples, sampled.seed, sampled.draft_sample_method) == (2, 0, "greedy")
    with pytest.raises(UsageError, match="draft_sample_method"):
        eval_sampling(1.0, draft_sample_method="beam")


def test_sampled_prompts_are_each_prompt_samples_times_keyed_by_its_tokens():
    rows, units = sampled_prompts([Prompt(4, [1, 2], "code"), Prompt(9, [3], None)], 2)
    assert [r.index for r in rows] == [0, 1, 2, 3] and [r.input_ids for r in rows] == [[1, 2]] * 2 + [[3]] * 2
    assert [(u.prompt_index, u.sample, u.dataset) for u in units] == [(4, 0, "code"), (4, 1, "code"),
                                                                      (9, 0, None), (9, 1, None)]
    assert units[0].prompt_key == prompt_key([1, 2]) != units[2].prompt_key


def test_units_add_up_to_the_stats_they_came_from():
    from dspark_hub.train.evaluation.units import unit_records

    stats = AcceptanceStats(2)
    stats.record(1, [0.5, 0.25])
    with pytest.raises(ValueError, match="2 units for 1 measured"):
        unit_records(_units(2), [stats])
    record, = unit_records(_units(1), [stats])
    assert (record["drafts"], record["accepted_per_position"], record["expected_per_position"]) == (1, [1, 0],
                                                                                                   [0.5, 0.25])


def test_the_json_document_round_trips(sampled, tmp_path):
    (tmp_path / "e.json").write_text(json.dumps(sampled))
    assert json.loads((tmp_path / "e.json").read_text())["units"] == sampled["units"]


@pytest.mark.parametrize(("args", "what"), [
    (["--top-p", "0.9"], "top-p"), (["--top-k", "20"], "top-k"),
    (["--draft-sample-method", "probabilistic"], "probabilistic drafting"),
    (["--top-k", "20", "--draft-sample-method", "probabilistic"], "top-k and probabilistic drafting")])
def test_vllm_on_a_cpu_refuses_what_its_kernels_cannot_sample_in_one_line(args, what):
    """The real engine process, in this interpreter (no CUDA device): it refuses before vLLM would start, since
    only the engine's interpreter knows it has no GPU."""
    import sys

    result = CliRunner().invoke(cli, ["eval", "--engine", "vllm", "--vllm-python", sys.executable, "--draft",
                                      str(DRAFT), "--target", str(TARGET), "--prompts", str(PROMPTS),
                                      "--temperature", "1", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"Error: --temperature: vLLM 0.32.0's CPU wheel cannot run {what} ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_vllm_at_a_temperature_alone_is_not_refused_for_sampling():
    import importlib.util
    import sys

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this interpreter has vllm: the engine would start")
    result = CliRunner().invoke(cli, ["eval", "--engine", "vllm", "--vllm-python", sys.executable, "--draft",
                                      str(DRAFT), "--target", str(TARGET), "--prompts", str(PROMPTS),
                                      "--temperature", "1"])
    assert result.exit_code == 2 and "cannot import vllm" in result.output     # it got past the check
