"""`eval --k`, `--profile`, `--costs measure` end to end on the fixtures of tests/fixtures/specdec/ (vLLM's own
counts recorded there), and the CLI's refusals of serving options that cannot work.

The sweep's k equal to the draft's is the count vLLM 0.32.0 measured (`vllm_eval.json`), and each other k equals
a separate `eval --block-size k` on the same prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError
from dspark_hub.format.speculation_profile import PROFILE_NAME
from dspark_hub.train.evaluation.costs import context_rollout, measure_costs
from dspark_hub.train.evaluation.decoding import eval_sampling
from dspark_hub.train.evaluation.evaluate import evaluate
from dspark_hub.train.evaluation.serving import ServingOptions
from dspark_hub.train.target.generate import Rollout
from tests.cli_errors import assert_one_line_error

SPECDEC = Path(__file__).parent / "fixtures" / "specdec"
DRAFT, TARGET, PROMPTS = SPECDEC / "dspark", SPECDEC / "target", SPECDEC / "prompts.jsonl"
RECORDED = json.loads((SPECDEC / "vllm_eval.json").read_text())
MAX_TOKENS = RECORDED["measured_by"]["max_tokens"]
COUNTS = ("drafts", "accepted_per_position", "tokens", "prompts", "k")


def _counts(doc: dict) -> dict:
    return {key: doc[key] for key in COUNTS}


def _run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _copied_draft(tmp_path: Path) -> Path:
    draft = tmp_path / "draft"
    draft.mkdir()
    for name in ("config.json", "model.safetensors"):
        (draft / name).write_bytes((DRAFT / name).read_bytes())
    return draft


@pytest.mark.slow
@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_a_sampled_sweep_counts_each_k_as_a_sampled_eval_at_that_k_alone(tmp_path, one_torch_thread, method):
    """At a temperature the sweep's paths are the target's samples (continued for the largest k) and each k is
    judged by vLLM's rejection sampling: every k's counts, prompts counted once however many samples, equal a
    sampled `eval --block-size k` with the same seed; the buckets and the profile say how it decoded."""
    draft = _copied_draft(tmp_path)
    sampling = eval_sampling(0.3, draft_sample_method=method, samples=2, seed=5)
    swept = evaluate(draft, target=str(TARGET), prompts=str(PROMPTS), max_new_tokens=MAX_TOKENS, sampling=sampling,
                     serving=ServingOptions(ks="2,4", by_context=True, profile=True)).to_dict()
    for k in (2, 4):
        alone = evaluate(draft, target=str(TARGET), prompts=str(PROMPTS), max_new_tokens=MAX_TOKENS,
                         sampling=sampling, block_size=k).to_dict()
        assert _counts(swept["sweep"]["by_k"][str(k)] | {"k": k}) == _counts(alone)
        assert alone["prompts"] == 8 and alone["intervals"]["units"] == 16
    assert sum(row["drafts"] for row in swept["by_context"]["rows"]
               if row["dataset"] == "all prompts") == swept["drafts"]
    assert swept["calibration"] is None                 # a confidence head's calibration is greedy only
    conditions = json.loads((draft / PROFILE_NAME).read_text())["measurement_conditions"]
    assert conditions["decoding"] == "sampled" and conditions["temperature"] == 0.3
    assert conditions["sampling"] == sampling.describe() and "rejection-sampling" in conditions["engine"]
    assert conditions["prompts"] == 8


@pytest.mark.slow
def test_a_sweep_counts_each_k_as_its_own_eval_and_writes_the_profile(tmp_path, one_torch_thread):
    draft = tmp_path / "draft"
    draft.mkdir()
    for name in ("config.json", "model.safetensors"):
        (draft / name).write_bytes((DRAFT / name).read_bytes())
    args = ["eval", "--draft", draft, "--target", TARGET, "--prompts", PROMPTS, "--max-new-tokens", MAX_TOKENS,
            "--k", "2,4", "--draft-cost", "0.1", "--verify-cost", "1.0,1.1", "--profile", "--json", "--quiet"]
    result = _run(*args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["sweep"]["ks"] == [2, 4]
    assert _counts(doc["sweep"]["by_k"]["4"] | {"k": 4}) == _counts(doc) == _counts(RECORDED)   # vLLM's own count
    alone = evaluate(draft, target=str(TARGET), prompts=str(PROMPTS), max_new_tokens=MAX_TOKENS, block_size=2)
    assert _counts(doc["sweep"]["by_k"]["2"] | {"k": 2}) == _counts(alone.to_dict())
    assert doc["speedup"]["best_k"] in (2, 4) and doc["calibration"]["k"] == 4
    profile = json.loads((draft / PROFILE_NAME).read_text())
    assert profile["accept_length_by_k"]["4"] == pytest.approx(doc["acceptance_length"], abs=1e-6)
    assert profile["max_supported_k"] == 4 and doc["profile"] == str(draft / PROFILE_NAME)
    assert str(tmp_path) not in json.dumps(profile)                  # the draft by its digests, never its path
    assert profile["measurement_conditions"]["decoding"] == "greedy"
    assert profile["measurement_conditions"]["temperature"] == 0.0
    again = _run(*[a for a in args if a != "--json"])                 # refused before any work, nothing changed
    assert_one_line_error(again, PROFILE_NAME, "--force")
    assert json.loads((draft / PROFILE_NAME).read_text()) == profile


@pytest.mark.parametrize(("extra", "words"), [
    (["--k", "0"], ["--k", "1 or more"]),
    (["--k", "4-2"], ["--k", "runs down"]),
    (["--draft-cost", "0.1"], ["--verify-cost", "both costs"]),
    (["--costs", "measure", "--draft-cost", "0.1", "--verify-cost", "1"], ["--costs", "not both"]),
    (["--by-context", "--engine", "vllm"], ["--engine", "simulated"]),
    (["--context-edges", "64,32"], ["--context-edges", "increasing"]),
])
def test_serving_options_that_cannot_work_are_refused_in_one_line(extra, words):
    assert_one_line_error(_run("eval", "--draft", DRAFT, "--target", TARGET, "--prompts", PROMPTS, *extra), *words)


def _rollout(length: int, prompt: int) -> Rollout:
    ids = torch.arange(length) % 200
    return Rollout(0, None, ids, prompt, torch.zeros(length, 192), torch.zeros(0))


def test_costs_are_timed_in_the_middle_of_the_median_rollout():
    rollouts = [_rollout(40, 16), _rollout(30, 16), _rollout(60, 16)]
    chosen, context = context_rollout(rollouts, 4)
    assert len(chosen.input_ids) == 40 and context == 16 + 12
    with pytest.raises(UsageError, match="past its prompt"):
        context_rollout([_rollout(20, 16)], 4)


@pytest.mark.slow
def test_measured_costs_are_ratios_to_a_decode_step_for_every_k(one_torch_thread):
    from dspark_hub.train.evaluation.drafters import sweep_drafter_for
    from dspark_hub.train.evaluation.inputs import read_draft
    from dspark_hub.train.target.target import Target, load_target

    draft, target = read_draft(DRAFT), Target.open(TARGET)
    taps = torch.randn(40, 3 * target.config["hidden_size"])
    rollout = Rollout(0, None, torch.arange(40) % 200, 16, taps, torch.zeros(0))
    costs = measure_costs(load_target(TARGET), [rollout], sweep_drafter_for(draft, target), [1, 3], repeats=2)
    assert costs.source == "measured" and set(costs.draft) == set(costs.verify) == {1, 3}
    assert all(c > 0 for c in [*costs.draft.values(), *costs.verify.values()]) and costs.decode_seconds > 0
    assert "CPU, float32" in costs.detail and "context 28 tokens" in costs.detail
