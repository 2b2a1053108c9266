"""Will it be faster, and what to serve it with: the expected speedup, speculation_profile.json, verify's served-k
finding and the card's tables (toy numbers and fixtures; no model runs).

Failing twins: a speedup formula that ignores the verify cost picks another best k; a served k equal to the
trained one, or a draft whose block is not recorded, gives no finding.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from dspark_hub import schemas
from dspark_hub.cards.lint import lint_card
from dspark_hub.cards.render import render_card
from dspark_hub.errors import RefusedOverwriteError, UsageError
from dspark_hub.format.checkpoint import LocalSource
from dspark_hub.format.registry import K3, SPECULATORS
from dspark_hub.format.speculation_profile import (
    PROFILE_NAME,
    KCounts,
    ProfileInputs,
    accept_length_by_k,
    build_profile,
    expected_speedup_by_k,
    trained_k,
)
from dspark_hub.train.evaluation.acceptance import measure_sweep
from dspark_hub.train.evaluation.by_context import ContextTally
from dspark_hub.train.evaluation.calibration import CalibrationTally
from dspark_hub.train.evaluation.evaluate import check_profile_writable
from dspark_hub.train.evaluation.speedup import expected_speedup, given_costs, speedup_table
from dspark_hub.verify.checks import verify
from tests.test_serving_sweep import _block_drafter, _world

SPEC_DRAFT = Path(__file__).parent / "fixtures" / "specdec" / "dspark"      # speculators DSpark, block_size 4

# AL(k) and costs where verifying more tokens costs more (a GPU past its flat region, or any CPU)
AL = {1: 1.8, 2: 2.4, 3: 2.8, 4: 3.0}
DRAFT_COST = [0.1]
VERIFY_COST = [1.1, 1.3, 1.6, 2.0]


# ----------------------------------------------------------------------------- the expected speedup


def test_the_expected_speedup_divides_al_by_the_draft_and_the_verify_cost():
    table = speedup_table(AL, given_costs(DRAFT_COST, VERIFY_COST, [1, 2, 3, 4]))
    assert [table.by_k[k].expected_speedup for k in AL] == pytest.approx([1.8 / 1.2, 2.4 / 1.4, 2.8 / 1.7, 3.0 / 2.1])
    assert table.best_k == 2
    assert "estimate" in table.label and "user-given costs" in table.label


def test_the_twin_a_formula_that_ignores_the_verify_cost_serves_the_largest_k():
    ignoring = {k: expected_speedup(al, DRAFT_COST[0], 1.0) for k, al in AL.items()}   # verify = one decode step
    assert max(ignoring, key=ignoring.get) == 4
    right = speedup_table(AL, given_costs(DRAFT_COST, VERIFY_COST, [1, 2, 3, 4]))
    assert right.best_k != max(ignoring, key=ignoring.get)
    assert all(right.by_k[k].expected_speedup < ignoring[k] for k in AL)


def test_one_cost_serves_every_k_and_a_list_gives_one_per_k():
    costs = given_costs([0.05], [1.0, 1.0, 1.02, 1.05], [1, 2, 3, 4])
    assert costs.draft == {1: 0.05, 2: 0.05, 3: 0.05, 4: 0.05} and costs.verify[4] == 1.05
    assert costs.source == "given" and costs.to_dict()["draft"] == {"1": 0.05, "2": 0.05, "3": 0.05, "4": 0.05}


@pytest.mark.parametrize(("draft", "verify", "says"), [
    ([0.0], [1.0], "positive"), ([-0.1], [1.0], "positive"), ([math.nan], [1.0], "positive"),
    ([0.1], [math.inf], "positive"), ([0.1, 0.2], [1.0], "one cost for every k"),
    ([0.1], [1.0, 1.0, 1.0, 1.0, 1.0], "one cost for every k")])
def test_costs_that_cannot_be_right_are_refused(draft, verify, says):
    with pytest.raises(UsageError, match=says):
        given_costs(draft, verify, [1, 2, 3, 4])


def test_a_speedup_needs_costs_for_a_measured_k():
    with pytest.raises(UsageError, match="costs for the measured k"):
        speedup_table({5: 2.0}, given_costs([0.1], [1.0], [1, 2]))


# ----------------------------------------------------------------------------- speculation_profile.json

#: Model-Optimizer's keys (specdec_bench/speculation_profile.py build_profile, schema_version 1.0).
MODELOPT_KEYS = {"schema_version", "measured", "method", "draft_checkpoint", "target_model",
                 "num_speculative_tokens", "block_size", "max_supported_k", "verification_method",
                 "conditional_accept_rates", "marginal_accept_rates", "mean_accept_length",
                 "mean_accept_length_per_request", "accept_length_model", "accept_length_by_k",
                 "acceptance_length_histogram", "per_category", "measurement_conditions", "validation"}


def _counts() -> dict[int, KCounts]:
    return {2: KCounts(2, 100, [60, 30], 1.95), 3: KCounts(3, 90, [55, 30, 12], 2.1)}


def test_the_profile_carries_model_optimizers_keys_and_ours_beside_them():
    speed = speedup_table({2: 1.9, 3: 2.08}, given_costs([0.1], [1.2], [2, 3])).to_dict()
    doc = build_profile(ProfileInputs(_counts(), 3, "sha256 config.json 1a2b", "org/target@abc", block_size=4,
                                      trained_k=4, per_category={"code": 2.3}, speedup=speed))
    assert set(doc) - {"dspark_hub"} == MODELOPT_KEYS
    assert doc["marginal_accept_rates"] == pytest.approx([55 / 90, 30 / 90, 12 / 90], abs=1e-6)
    assert doc["conditional_accept_rates"] == pytest.approx([55 / 90, 30 / 55, 12 / 30], abs=1e-6)
    assert doc["mean_accept_length"] == pytest.approx(1 + 97 / 90, abs=1e-6)
    assert doc["acceptance_length_histogram"] == {"1": 35, "2": 25, "3": 18, "4": 12}
    assert doc["accept_length_by_k"] == {"2": 1.9, "3": pytest.approx(1 + 97 / 90, abs=1e-6)}
    assert (doc["max_supported_k"], doc["accept_length_model"]) == (4, "measured_per_k")
    assert doc["validation"]["mean_consistency"]["passed"] and doc["validation"]["marginal_monotonicity"]["passed"]
    assert doc["dspark_hub"]["schema"] == schemas.SPECULATION_PROFILE
    assert doc["dspark_hub"]["expected_speedup"]["best_k"] == 3


def test_the_histogram_is_what_model_optimizer_reads_the_marginals_from():
    counts = _counts()[3]
    histogram = {int(length): n for length, n in counts.histogram.items()}
    survival = [sum(n for length, n in histogram.items() if length >= i + 2) / counts.drafts for i in range(3)]
    assert survival == pytest.approx(counts.marginal) and sum(histogram.values()) == counts.drafts


def test_without_a_recorded_block_the_ceiling_is_the_largest_k_measured():
    doc = build_profile(ProfileInputs(_counts(), 3, None, None))
    assert doc["max_supported_k"] == 3 and "not recorded" in doc["dspark_hub"]["max_supported_k_source"]


def test_the_acceptance_length_per_k_reads_back_from_a_profile_and_from_an_eval_document():
    profile = build_profile(ProfileInputs(_counts(), 3, None, None))
    assert accept_length_by_k(profile) == {2: 1.9, 3: pytest.approx(1 + 97 / 90, abs=1e-6)}
    evaluated = {"k": 7, "acceptance_length": 2.5,
                 "sweep": {"by_k": {"5": {"acceptance_length": 3.1}, "7": {"acceptance_length": 2.5}}},
                 "speedup": {"by_k": {"5": {"expected_speedup": 1.9}, "7": {"expected_speedup": 1.4}}}}
    assert accept_length_by_k(evaluated) == {5: 3.1, 7: 2.5}
    assert expected_speedup_by_k(evaluated) == {5: 1.9, 7: 1.4}
    assert accept_length_by_k({"k": 4, "acceptance_length": 1.5}) == {4: 1.5}
    assert accept_length_by_k({"sweep": "no"}) == {} and expected_speedup_by_k({}) == {}


def test_the_profile_is_refused_over_an_existing_one_without_force(tmp_path):
    draft = shutil.copytree(SPEC_DRAFT, tmp_path / "draft")
    check_profile_writable(draft, [], force=False)          # nothing there yet
    (draft / PROFILE_NAME).write_text("{}")
    with pytest.raises(RefusedOverwriteError):
        check_profile_writable(draft, [], force=False)
    check_profile_writable(draft, [], force=True)


@pytest.mark.parametrize("points_at", ["config.json", "model.safetensors"])
def test_a_profile_that_is_a_link_to_a_file_of_the_draft_is_refused_even_with_force(tmp_path, points_at):
    draft = shutil.copytree(SPEC_DRAFT, tmp_path / "draft")
    (draft / PROFILE_NAME).symlink_to(draft / points_at)
    with pytest.raises(UsageError, match="input `draft`"):
        check_profile_writable(draft, [], force=True)


# ----------------------------------------------------------------------------- the trained block


def _k3(tmp_path: Path, block: int | None) -> Path:
    from dspark_hub.ops.init import init_checkpoint

    folder = init_checkpoint(tmp_path / "k3", profile="tiny", seed=1).path
    if block is not None:
        (folder / "training_args.json").write_text(json.dumps({"block_size": block, "steps": 3}))
    return folder


def test_the_trained_k_comes_from_the_config_or_from_what_finetune_recorded(tmp_path):
    config = json.loads((SPEC_DRAFT / "config.json").read_text())
    assert trained_k(SPECULATORS, config, LocalSource(SPEC_DRAFT))[0] == 4
    bonus = {**config, "sample_from_anchor": False}
    assert trained_k(SPECULATORS, bonus, LocalSource(SPEC_DRAFT))[0] == 3
    k3 = _k3(tmp_path, 5)
    assert trained_k(K3, json.loads((k3 / "config.json").read_text()), LocalSource(k3)) == \
        (5, "training_args.json block_size")


@pytest.mark.parametrize("record", ['{"steps": 3}', '{"block_size": "5"}', '{"block_size": 0}', "not json", "[5]"])
def test_no_readable_block_in_the_record_leaves_the_trained_k_unknown(tmp_path, record):
    k3 = _k3(tmp_path, None)
    (k3 / "training_args.json").write_text(record)
    assert trained_k(K3, json.loads((k3 / "config.json").read_text()), LocalSource(k3))[0] is None


# ----------------------------------------------------------------------------- verify: a served k beyond the block


def _findings(path: Path, **kwargs) -> list:
    return [f for f in verify(path, **kwargs).findings if f.code == "SERVED_K_BEYOND_BLOCK"]


def _eval_doc(tmp_path: Path) -> Path:
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"k": 4, "acceptance_length": 1.29, "sweep": {"by_k": {
        "3": {"acceptance_length": 1.5}, "4": {"acceptance_length": 1.29}, "6": {"acceptance_length": 1.1}}},
        "speedup": {"by_k": {"3": {"expected_speedup": 1.3}, "4": {"expected_speedup": 1.1},
                             "6": {"expected_speedup": 0.8}}}}))
    return path


def test_a_served_k_beyond_the_trained_block_is_flagged_with_its_measured_cost(tmp_path):
    [finding] = _findings(SPEC_DRAFT, block_size=6, eval_json=_eval_doc(tmp_path))
    assert finding.severity == "warning"
    assert "k=6" in finding.message and "trained to draft 4" in finding.message
    assert "1.10 at k=6, 1.50 at k=3" in finding.message and "0.80x at k=6, 1.30x at k=3" in finding.message
    [unmeasured] = _findings(SPEC_DRAFT, block_size=6)
    assert "not measured" in unmeasured.message


def test_the_twins_a_served_k_within_the_block_or_an_unknown_block_is_not_flagged(tmp_path):
    assert _findings(SPEC_DRAFT, block_size=4, eval_json=_eval_doc(tmp_path)) == []
    assert _findings(SPEC_DRAFT, block_size=2) == []
    assert _findings(_k3(tmp_path / "a", None), block_size=9) == []            # a k3_dspark block is not recorded
    [k3] = _findings(_k3(tmp_path / "b", 5), runtime=["vllm"])                 # served at the reference's 7
    assert "k=7" in k3.message and "training_args.json" in k3.message


def test_an_eval_that_did_not_measure_the_served_k_says_so(tmp_path):
    [finding] = _findings(SPEC_DRAFT, block_size=5, eval_json=_eval_doc(tmp_path))
    assert "did not measure k=5" in finding.message


@pytest.mark.parametrize("content", ['{"k": 4}', "[1, 2]", "{", '{"sweep": {"by_k": {"4": {}}}}'])
def test_an_eval_file_without_a_length_per_k_is_refused_before_verify_reads_the_weights(tmp_path, content):
    bad = tmp_path / "eval.json"
    bad.write_text(content)
    with pytest.raises(UsageError) as info:
        verify(SPEC_DRAFT, eval_json=bad)
    assert info.value.param == "eval_json" and "\n" not in str(info.value)


# ----------------------------------------------------------------------------- the card


def _eval_json(tmp_path: Path) -> Path:
    """An eval document whose serving sections come from the code that writes them (toy counts)."""
    tallies = [ContextTally(3, [20, 40]), CalibrationTally(3)]
    sweep = measure_sweep(_world(), _block_drafter, [1, 2, 3, 5], observe=lambda *step: [t(*step) for t in tallies])
    lengths = {k: m.overall.acceptance_length for k, m in sweep.by_k.items()}
    speed = speedup_table(lengths, given_costs([0.08], [1.0, 1.0, 1.05, 1.2], [1, 2, 3, 5]))
    main = sweep.by_k[3].measurement
    doc = {"schema": schemas.command("eval"), "ok": True, "engine": "simulated", **main.to_dict(),
           "harness": {"mode": "simulated", "simulation": "a toy verify loop", "block_size": 3, "dtype": "float32",
                       "prompts_sha256": "ab" * 32},
           "sweep": sweep.to_dict(), "speedup": speed.to_dict(), "by_context": tallies[0].result().to_dict(),
           "calibration": tallies[1].result().to_dict()}
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(doc))
    return path


def _card_source(tmp_path: Path) -> Path:
    path = tmp_path / "card.yaml"
    path.write_text(yaml.safe_dump({"name": "Toy-Draft", "front_matter": {
        "license": "apache-2.0", "base_model": "org/target", "base_model_relation": "finetune",
        "tags": ["dspark"], "pipeline_tag": "text-generation"}}))
    return path


def test_the_card_shows_every_k_the_speedup_with_its_costs_context_buckets_and_calibration(tmp_path):
    from dspark_hub.ops.init import init_checkpoint

    ckpt = init_checkpoint(tmp_path / "ckpt", profile="tiny", seed=1).path
    evaluated = _eval_json(tmp_path)
    text = render_card(_card_source(tmp_path), ckpt, evaluated)
    assert "| k | Acceptance length | Draft step cost | Verify cost | Expected speedup |" in text
    assert "Acceptance numbers: simulated (a toy verify loop, k=1-5, float32, prompts abababababab)" in text
    assert "Expected speedup: an estimate" in text and "user-given costs" in text
    assert "| Sub-domain | Context | Pos 0 | Pos 1 | Pos 2 | Acceptance length |" in text
    assert "| all prompts | 1-19 |" in text and "| Position | Drafts | Estimated survival |" in text
    assert "Calibration: the confidence head's estimated prefix survival" in text
    readme = tmp_path / "README.md"
    readme.write_text(text)
    assert [f.code for f in lint_card(readme, eval_json=evaluated).findings if f.severity == "error"] == []


def test_the_twin_a_sweep_row_outside_its_labels_k_range_fails_lint(tmp_path):
    from dspark_hub.ops.init import init_checkpoint

    ckpt = init_checkpoint(tmp_path / "ckpt", profile="tiny", seed=1).path
    text = render_card(_card_source(tmp_path), ckpt, _eval_json(tmp_path)).replace("k=1-5,", "k=1-3,")
    readme = tmp_path / "README.md"
    readme.write_text(text)
    assert "ACCEPTANCE_LABEL_MISMATCH" in [f.code for f in lint_card(readme).findings]

