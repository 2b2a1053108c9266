"""`dspark-hub compare A.json B.json`: paired over prompts, refusals, the gate's false alarms and power.

The statistics run on synthetic eval documents whose truth is known: each prompt has its own acceptance
rate (prompts differ a lot, as real prompts do), each sampled path moves it a little, and two measurements
of the same prompts share the prompt (and, with the same seed, the path). A comparison that ignores the
pairing (the twin below) cannot see a drop that is small next to the spread between prompts.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError
from dspark_hub.train.evaluation.acceptance_intervals import Interval, ratio_interval, student_t_quantile
from dspark_hub.train.evaluation.compare import compare

PROMPTS, SAMPLES, DRAFTS = 20, 2, 40


def make_doc(path_rates: list[list[float]], *, seed: int = 0, engine: str = "simulated", k: int = 2,
             temperature: float = 1.0, target: str = "t", budget: int = 96, keys: list[str] | None = None) -> dict:
    """An eval/3 document: units with counts drawn at `path_rates[prompt][sample]` and the expected numbers."""
    draw = random.Random(seed)
    units = []
    for p, rates in enumerate(path_rates):
        for s, rate in enumerate(rates):
            first = sum(draw.random() < rate for _ in range(DRAFTS))
            second = sum(draw.random() < rate for _ in range(first))
            units.append({"prompt_key": keys[p] if keys else f"key{p}", "prompt_index": p,
                          "dataset": "even" if p % 2 == 0 else "odd", "sample": s, "drafts": DRAFTS, "tokens": 90,
                          "accepted_per_position": [first, second],
                          "expected_per_position": [DRAFTS * rate, DRAFTS * rate * rate]})
    drafts = sum(u["drafts"] for u in units)
    accepted = [sum(u["accepted_per_position"][i] for u in units) for i in range(k)]
    sampling = {"temperature": temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                "draft_sample_method": "greedy", "samples": len(path_rates[0]), "seed": seed,
                "describe": f"temperature {temperature:g}; greedy drafting; {len(path_rates[0])} samples a prompt"}
    return {"schema": "dspark-hub/eval/3", "engine": engine, "k": k, "drafts": drafts,
            "accepted_per_position": accepted, "acceptance_length": 1 + sum(accepted) / drafts, "sampling": sampling,
            "harness": {"teacher_identity": {"digests": {"config.json": target}}, "max_new_tokens": budget},
            "units": units}


def prompt_rates(seed: int) -> list[float]:
    """Each prompt's own rate: from 0.1 to 0.7, the spread between kinds of text."""
    draw = random.Random(seed)
    return [draw.uniform(0.1, 0.7) for _ in range(PROMPTS)]


def path_rates(rates: list[float], seed: int, shift: float = 0.0) -> list[list[float]]:
    draw = random.Random(seed)
    return [[min(0.95, max(0.01, r + draw.gauss(0, 0.03))) + shift for _ in range(SAMPLES)] for r in rates]


def write(tmp_path: Path, name: str, doc: dict) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def unpaired_difference(num_a, den_a, num_b, den_b, *, level: float = 0.95, over: str = "prompts") -> Interval:
    """The twin: each side's own interval, their variances added, as if A and B were other prompts."""
    a = ratio_interval(num_a, den_a, level=level, over=over)
    b = ratio_interval(num_b, den_b, level=level, over=over)
    quantile = student_t_quantile((1 + level) / 2, len(num_a) - 1)
    half = quantile * math.hypot(a.half_width / quantile, b.half_width / quantile)
    return Interval(b.estimate - a.estimate, b.estimate - a.estimate - half, b.estimate - a.estimate + half, level,
                    "unpaired")


def gate_fails(tmp_path: Path, a: dict, b: dict, **options) -> bool:
    return not compare(write(tmp_path, "a.json", a), write(tmp_path, "b.json", b), fail_if_worse=0.0, **options).ok


# -- the gate: false alarms and power ----------------------------------------------------------------------

def test_a_draft_against_itself_under_another_seed_raises_few_false_alarms(tmp_path):
    """100 replications: the same prompts, other paths and coins. A 95% two-sided interval's upper end
    falls below 0 about 2.5% of the time; 10 or more of 100 would be 4.8 standard deviations out."""
    alarms = 0
    for rep in range(100):
        rates = prompt_rates(rep)
        a = make_doc(path_rates(rates, 1000 + rep), seed=rep)
        b = make_doc(path_rates(rates, 5000 + rep), seed=10_000 + rep)
        alarms += gate_fails(tmp_path, a, b)
    assert alarms < 10


@pytest.mark.parametrize(("difference", "detects"), [(None, True), (unpaired_difference, False)])
def test_a_small_drop_on_every_prompt_is_caught_by_the_paired_interval_only(tmp_path, difference, detects):
    """B accepts 0.03 less on every path of every prompt (same seed: the same paths). Paired, the prompts'
    spread cancels and the drop is caught nearly always; unpaired it drowns in that spread. The twin fails
    the assertion that the paired gate passes."""
    caught = 0
    for rep in range(40):
        rates = prompt_rates(rep)
        a = make_doc(path_rates(rates, rep), seed=rep)
        b = make_doc(path_rates(rates, rep, shift=-0.03), seed=rep)
        options = {} if difference is None else {"difference": difference}
        caught += gate_fails(tmp_path, a, b, **options)
    assert (caught >= 36) == detects


def test_the_gate_reads_the_expected_numbers_of_two_simulations_and_the_counts_otherwise(tmp_path):
    rates = prompt_rates(3)
    a, b = make_doc(path_rates(rates, 3)), make_doc(path_rates(rates, 3, shift=-0.01))
    both = compare(write(tmp_path, "a.json", a), write(tmp_path, "b.json", b))
    assert both.gated_on == "expected"
    assert both.acceptance_length.difference.estimate == pytest.approx(-0.01 * (1 + 2 * 0.4), abs=0.01)
    served = compare(write(tmp_path, "a.json", a), write(tmp_path, "b.json", {**b, "engine": "vllm"}))
    assert served.gated_on == "counts" and served.counts.difference == served.acceptance_length.difference


def test_samples_are_summed_per_prompt_so_different_sample_counts_still_pair(tmp_path):
    rates = prompt_rates(4)
    a = make_doc([r[:1] for r in path_rates(rates, 4)])
    b = make_doc(path_rates(rates, 8))
    result = compare(write(tmp_path, "a.json", a), write(tmp_path, "b.json", b))
    assert result.prompts == PROMPTS and len(result.per_position) == 2


# -- what it reports -----------------------------------------------------------------------------------------

def test_the_report_names_datasets_and_the_prompts_that_moved_most(tmp_path):
    rates = prompt_rates(5)
    moved = path_rates(rates, 5)
    moved[7] = [r - 0.3 for r in moved[7]]
    result = compare(write(tmp_path, "a.json", make_doc(path_rates(rates, 5))), write(tmp_path, "b.json",
                                                                                      make_doc(moved)))
    doc = result.to_dict()
    assert doc["schema"] == "dspark-hub/compare/1"
    assert doc["movers"][0]["prompt_index"] == 7 and doc["movers"][0]["difference"] < -0.3
    assert set(doc["by_dataset"]) == {"even", "odd"} and doc["by_dataset"]["odd"]["prompts"] == PROMPTS // 2
    assert doc["by_dataset"]["odd"]["difference"]["estimate"] < doc["by_dataset"]["even"]["difference"]["estimate"]


@pytest.mark.parametrize(("delta", "code"), [("0.05", 1), ("0.5", 0)])
def test_fail_if_worse_exits_1_only_beyond_delta(tmp_path, delta, code):
    rates = prompt_rates(6)
    a = write(tmp_path, "a.json", make_doc(path_rates(rates, 6)))
    b = write(tmp_path, "b.json", make_doc(path_rates(rates, 6, shift=-0.1)))
    result = CliRunner().invoke(cli, ["compare", str(a), str(b), "--fail-if-worse", delta])
    assert result.exit_code == code, result.output
    assert ("worse by more than" in result.stdout) and ("not worse" in result.stdout) == (code == 0)
    assert json.loads(CliRunner().invoke(cli, ["compare", str(a), str(b), "--json"]).stdout)["ok"] is True


# -- refusals ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "says"), [
    ({"doc_k": 3}, "drafts k=2 a step"),
    ({"temperature": 0.7}, "decode differently (temperature 1.0 against 0.7)"),
    ({"target": "other"}, "different targets"),
    ({"budget": 48}, "96 output tokens"),
    ({"keys": [f"other{p}" for p in range(PROMPTS)]}, "measured different prompts (20 only in A, 20 only in B)"),
])
def test_measurements_of_different_things_are_refused_in_one_line(tmp_path, change, says):
    rates = path_rates(prompt_rates(7), 7)
    a = write(tmp_path, "a.json", make_doc(rates))
    other = make_doc(rates, **{key: value for key, value in change.items() if key != "doc_k"})
    b = write(tmp_path, "b.json", {**other, "k": change.get("doc_k", other["k"])})
    result = CliRunner().invoke(cli, ["compare", str(a), str(b)])
    assert result.exit_code == 2 and says in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_drafting_method_is_part_of_the_decoding(tmp_path):
    rates = path_rates(prompt_rates(7), 7)
    probabilistic = make_doc(rates)
    probabilistic["sampling"]["draft_sample_method"] = "probabilistic"
    with pytest.raises(UsageError, match="draft_sample_method greedy against probabilistic"):
        compare(write(tmp_path, "a.json", make_doc(rates)), write(tmp_path, "b.json", probabilistic))


@pytest.mark.parametrize(("content", "says"), [
    ({"schema": "dspark-hub/eval/2", "k": 2}, "has no per-prompt units to pair"),
    ({"schema": "dspark-hub/verify/1"}, "not an eval document"),
    ([1, 2], "not an eval document"),
    ("{not json", "pass the output of 'dspark-hub eval --json'"),
    (None, "no such file"),
])
def test_a_file_that_is_not_an_eval_with_units_is_refused(tmp_path, content, says):
    good = write(tmp_path, "a.json", make_doc(path_rates(prompt_rates(8), 8)))
    bad = tmp_path / "b.json"
    if content is not None:
        bad.write_text(content if isinstance(content, str) else json.dumps(content))
    result = CliRunner().invoke(cli, ["compare", str(good), str(bad)])
    assert result.exit_code == 2 and says in result.stderr, result.output


def test_a_negative_delta_is_a_usage_error(tmp_path):
    a = write(tmp_path, "a.json", make_doc(path_rates(prompt_rates(9), 9)))
    assert CliRunner().invoke(cli, ["compare", str(a), str(a), "--fail-if-worse", "-0.1"]).exit_code == 2
    with pytest.raises(UsageError, match="fail_if_worse"):
        compare(a, a, fail_if_worse=math.nan)


# -- real drafts ------------------------------------------------------------------------------------------------

SPECDEC = Path(__file__).parent / "fixtures" / "specdec"


def zeroed_markov(folder: Path) -> Path:
    """The fixtures' speculators draft with its Markov head zeroed (every other tensor as trained)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(SPECDEC / "dspark", folder)
    tensors = load_file(folder / "model.safetensors")
    zeroed = [name for name in tensors if name.startswith("markov_head.")]
    assert zeroed, "the fixture draft has no Markov head"
    save_file({name: t.zero_() if name in zeroed else t for name, t in tensors.items()}, folder / "model.safetensors")
    return folder


def sampled_eval(tmp_path: Path, name: str, draft: Path, seed: int) -> Path:
    """`eval --json` of a draft on the fixtures at T = 0.1, 16 samples a prompt (where this tiny target still
    accepts past the first position: at T = 1 it accepts almost nothing, with or without the head)."""
    result = CliRunner().invoke(cli, ["eval", "--draft", str(draft), "--target", str(SPECDEC / "target"),
                                      "--prompts", str(SPECDEC / "prompts.jsonl"), "--max-new-tokens", "16",
                                      "--temperature", "0.1", "--samples", "16", "--seed", str(seed), "--json"])
    assert result.exit_code == 0, result.output
    return write(tmp_path, f"{name}.json", json.loads(result.stdout))


@pytest.mark.slow
def test_a_draft_with_its_markov_head_zeroed_fails_the_gate_and_the_draft_against_itself_does_not(tmp_path):
    """Same seed, same sampled paths: B - A is the draft's own change. Measured (seeds 0 to 3, zeroed - trained):
    -0.045, -0.041, -0.039, -0.050, each interval's upper end below 0; the trained draft under seed 1 against seed
    0: [-0.013, 0.031] (and [-0.025, 0.019], [-0.034, 0.053] for seeds 1-2 and 2-3)."""
    trained = sampled_eval(tmp_path, "trained", SPECDEC / "dspark", seed=0)
    zeroed = sampled_eval(tmp_path, "zeroed", zeroed_markov(tmp_path / "zeroed"), seed=0)
    reseeded = sampled_eval(tmp_path, "reseeded", SPECDEC / "dspark", seed=1)
    gate = CliRunner().invoke(cli, ["compare", str(trained), str(zeroed), "--fail-if-worse", "0"])
    assert gate.exit_code == 1, gate.output
    assert CliRunner().invoke(cli, ["compare", str(trained), str(reseeded), "--fail-if-worse", "0"]).exit_code == 0
