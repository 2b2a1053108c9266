"""Convention mistakes cost acceptance on a trained SmolLM2 draft, and the pipeline tells them apart
(docs/convention-mistakes.md; issue 22 item 4).

Each mistake is a mutated artifact (`bench/_mistakes.py`): a copy of the trained draft with one config
key or tensor changed, or a copy of the held-out rollouts with the last tap captured the other way. The
trained draft is each mutant's passing twin: both are measured on the same anchors of the same held-out
greedy paths by the expected accepted drafts per anchor (`_mistakes.expected_accepted`, teacher-forced as
the draft is served), and the trained draft must lead by `MARGIN_Z` paired standard errors. (Greedy
acceptance from `dspark-hub eval`, which bench/real_mistakes.py reports too, barely moves on a draft
trained for minutes.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dspark_hub.train.evaluation.inputs import read_draft
from tests.real_drafts import ROOT, TARGET, WORLD_READY, dspark_hub

sys.path.insert(0, str(ROOT / "bench"))

from _mistakes import (
    D2T,
    MARKOV_OUTPUT,
    expected_accepted,
    mistakes_for,
    normed_last_tap,
    paired_z,
    shifted_taps,
    target_layers,
)

needs_world = pytest.mark.skipif(not WORLD_READY, reason="the SmolLM2 world is not cached; build it: "
                                 ".ci/real-target.sh")


def on_the_real_world(test):
    """Marks a test that needs the SmolLM2 world and the session's trained drafts."""
    return pytest.mark.real(pytest.mark.slow(needs_world(test)))


FORMATS = ("k3_dspark", "speculators")
#: Which mistakes apply to the fixture's drafts (both tap the final layer; only speculators has the rest).
APPLICABLE = {"k3_dspark": ("taps_shifted", "final_norm_on_last_tap", "markov_dropped"),
              "speculators": ("taps_shifted", "slot_layout_flipped", "final_norm_on_last_tap", "d2t_absolute",
                              "markov_dropped")}
#: What a CI-sized draft cannot tell apart: it barely reads its context yet. Paired z on the CI-sized drafts
#: (`bench/real_recipe.py`'s `CI_FINETUNE`), finetune seeds 0, 1, 2 (2026-12-01): k3_dspark taps -1.8, -0.1, -5.8 and
#: final norm -2.6, +3.9, +4.0; speculators taps -1.8, +0.4, -2.9 and final norm -2.2, +0.7, -1.5. The ones
#: asserted: k3_dspark Markov +6.9, +7.3, +7.4; speculators slot layout +5.7, +6.4, +5.4, d2t +8.4, +8.8, +8.2,
#: Markov +5.6, +6.1, +5.9 (so `MARGIN_Z` 4 leaves 1.4 standard errors). For these two the test asserts that
#: the mistake reaches the draft (its per-anchor values change), not a loss: even a four-minute speculators
#: draft shows the final norm (z +6.4) but not shifted taps (z +1.5) (docs/convention-mistakes.md). Take a
#: case out of this set once the drafts the test trains show it over several seeds.
NOT_YET_MEASURABLE = {("k3_dspark", "taps_shifted"), ("k3_dspark", "final_norm_on_last_tap"),
                      ("speculators", "taps_shifted"), ("speculators", "final_norm_on_last_tap")}
CASES = [(fmt, key) for fmt in FORMATS for key in APPLICABLE[fmt]]
#: How many standard errors of the paired per-anchor difference the trained draft must lead by.
MARGIN_Z = 4.0


@pytest.fixture(scope="module")
def measured(real_drafts, tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Per format: the expected accepted drafts per held-out anchor of the trained draft (`trained`) and of
    each applicable mutant, all on the same greedy paths."""
    import torch

    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("mistakes")
    out: dict[str, dict[str, Any]] = {}
    shifted_data: dict[tuple[int, ...], Path] = {}     # by taps: drafts of both formats may share them
    for fmt in FORMATS:
        real = real_drafts[fmt]
        results = {"trained": expected_accepted(real.draft, real.heldout_data, real.target)}
        for mistake in mistakes_for(real.draft, target_layers(real.target)):
            if not mistake.applicable:
                continue
            assert mistake.write is not None
            artifact = work / f"{fmt}-{mistake.key}"
            mistake.write(real.heldout_data if mistake.mutates == "data" else real.draft, artifact)
            draft, data = (real.draft, artifact) if mistake.mutates == "data" else (artifact, real.heldout_data)
            if mistake.key == "taps_shifted":   # same prompts and settings, the shifted taps: the same paths
                manifest = json.loads((real.heldout_data / "manifest.json").read_text())
                taps = tuple(read_draft(artifact).taps)
                if taps not in shifted_data:
                    shifted_data[taps] = work / f"shifted-data-{len(shifted_data)}"
                    dspark_hub("rollouts", "--target", str(real.target), "--prompts", str(real.heldout_prompts),
                               "--draft-config", str(artifact / "config.json"), "--out", str(shifted_data[taps]),
                               "--max-new-tokens", str(manifest["settings"]["max_new_tokens"]), "--batch-size", "16")
                data = shifted_data[taps]
            results[mistake.key] = expected_accepted(draft, data, real.target)
        out[fmt] = results
    return out


@on_the_real_world
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_mistakes_that_apply_are_the_ones_the_draft_can_make(real_drafts, fmt):
    mistakes = mistakes_for(real_drafts[fmt].draft, 30)
    final_tap = read_draft(real_drafts[fmt].draft).taps[-1] == 29       # the fixture's drafts; a recipe run's not
    expected = tuple(k for k in APPLICABLE[fmt] if final_tap or k != "final_norm_on_last_tap")
    assert tuple(m.key for m in mistakes if m.applicable) == expected
    reasons = {m.key: m.reason_not_applicable for m in mistakes if not m.applicable}
    if fmt == "k3_dspark":
        assert "no slot-layout key" in str(reasons["slot_layout_flipped"])
        assert "no pruned vocabulary" in str(reasons["d2t_absolute"])


@on_the_real_world
@pytest.mark.parametrize("fmt, key", CASES)
def test_the_trained_draft_accepts_clearly_more_than_the_mistake(measured, fmt, key):
    if key not in measured[fmt]:
        pytest.skip(f"{key} does not apply to this {fmt} draft")
    trained, mutant = measured[fmt]["trained"], measured[fmt][key]
    assert trained.shape == mutant.shape      # the same anchors of the same paths
    z = paired_z(trained, mutant)
    if (fmt, key) in NOT_YET_MEASURABLE:
        # Not yet a significant loss on a draft this small, but the pipeline must still tell the two apart: the
        # mutated taps reach the draft and change its values at many anchors (65% for the CI-sized k3_dspark
        # draft's shifted taps, 2026-12-01; the rest are ~0 both ways). A pipeline that ignored the draft's tap
        # ids, or normed every capture the same way, would give both the same values (0%) and fail here.
        changed = float(((trained - mutant).abs() > 1e-7).float().mean())
        assert changed > 0.25, f"{key} changed the draft's expected acceptance at {changed:.0%} of the anchors"
        return
    assert z >= MARGIN_Z, (f"expected accepted per anchor: trained {float(trained.mean()):.5f}, "
                           f"{key} {float(mutant.mean()):.5f}, paired z {z:.2f}")


@pytest.mark.parametrize("good, bad, z", [
    ([0.2, 0.3, 0.25, 0.3], [0.1, 0.1, 0.15, 0.1], 5.196),
    ([0.2, 0.3, 0.25, 0.3], [0.2, 0.3, 0.25, 0.3], 0.0),
    ([0.1, 0.1, 0.15, 0.1], [0.2, 0.3, 0.25, 0.3], -5.196),
    ([0.2, 0.1, 0.3, 0.1], [0.1, 0.2, 0.1, 0.3], 0.0),
])
def test_paired_z_is_the_mean_difference_in_standard_errors(good, bad, z):
    import torch

    assert paired_z(torch.tensor(good), torch.tensor(bad)) == pytest.approx(z, abs=0.01)


@pytest.mark.parametrize("taps, layers, shifted, shift", [
    ([1, 7, 14, 22, 27], 30, [2, 8, 15, 23, 28], 1),
    ([7, 14, 22, 27, 28], 30, [8, 15, 23, 28, 29], 1),
    ([1, 7, 14, 22, 29], 30, [0, 6, 13, 21, 28], -1),
    ([0, 2], 4, [1, 3], 1),
    ([2, 3], 4, [1, 2], -1),
])
def test_taps_shift_up_unless_that_leaves_the_target(taps, layers, shifted, shift):
    assert shifted_taps(taps, layers) == (shifted, shift)


@on_the_real_world
def test_a_final_layer_tap_shifted_up_is_refused_not_measured(real_drafts, tmp_path):
    """+1 on a draft that taps the final layer names a layer the target lacks: eval refuses in one line."""
    real = real_drafts["k3_dspark"]
    config = json.loads((real.draft / "config.json").read_text())
    if config["target_layer_ids"][-1] != 29:
        pytest.skip("this k3_dspark draft does not tap the final layer")
    assert shifted_taps(config["target_layer_ids"], 30)[1] == -1     # so the mutant above shifts down
    from _mistakes import write_config_change

    write_config_change("target_layer_ids", [t + 1 for t in config["target_layer_ids"]])(real.draft,
                                                                                         tmp_path / "up")
    done = subprocess.run([sys.executable, "-m", "dspark_hub", "eval", "--draft", str(tmp_path / "up"), "--prompts",
                           str(real.heldout_prompts), "--target", str(TARGET)], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "target_layer_ids" in done.stderr, done.stderr


@on_the_real_world
def test_the_normed_tap_is_the_target_final_norm_of_the_captured_tap(real_drafts):
    """The final-norm mutant's rows are RMSNorm(tap) x the target's norm weight, to bf16 rounding."""
    import torch
    from safetensors import safe_open

    from dspark_hub.format.tensorio import tensor_files
    from dspark_hub.train.data.rollouts import RolloutData

    if read_draft(real_drafts["k3_dspark"].draft).taps[-1] != 29:
        pytest.skip("this k3_dspark draft does not tap the final layer")
    config = json.loads((TARGET / "config.json").read_text())
    files = tensor_files(TARGET)
    with safe_open(str(files["model.norm.weight"]), framework="pt") as handle:
        weight = handle.get_tensor("model.norm.weight").float()
    rollout = RolloutData(real_drafts["k3_dspark"].heldout_data)[0]
    hidden = config["hidden_size"]
    tap = rollout.aux_hidden_states[:, -hidden:].float()
    normed = tap * torch.rsqrt(tap.pow(2).mean(-1, keepdim=True) + config["rms_norm_eps"]) * weight
    mutated = normed_last_tap(rollout.aux_hidden_states, rollout.final_hidden_states, hidden)
    assert torch.equal(mutated[:, :-hidden], rollout.aux_hidden_states[:, :-hidden])
    torch.testing.assert_close(mutated[:, -hidden:].float(), normed, rtol=0.02, atol=0.02)
    assert not torch.allclose(tap, normed, rtol=0.1, atol=0.1)      # the norm changes the rows: a real mistake


@on_the_real_world
def test_the_mutants_change_only_what_they_name(real_drafts, tmp_path):
    """d2t: draft id i is served as target id d2t[i]; Markov: only markov_w2, zeroed; the rest bit for bit."""
    import torch

    from dspark_hub.modeling.speculators_dspark import read_tensors

    real = real_drafts["speculators"]
    by_key = {m.key: m for m in mistakes_for(real.draft, 30)}
    original = read_tensors(real.draft)
    for key, changed in (("d2t_absolute", D2T), ("markov_dropped", MARKOV_OUTPUT)):
        by_key[key].write(real.draft, tmp_path / key)
        copy = read_tensors(tmp_path / key)
        assert set(copy) == set(original)
        assert [n for n in original if not torch.equal(original[n], copy[n])] == [changed]
    d2t, mutated = original[D2T], read_tensors(tmp_path / "d2t_absolute")[D2T]
    ids = torch.arange(d2t.numel())
    assert torch.equal(ids + mutated, d2t)          # the correct reading of the copy = the mistaken reading
    assert not torch.any(read_tensors(tmp_path / "markov_dropped")[MARKOV_OUTPUT])


@on_the_real_world
def test_a_zeroed_markov_output_drafts_as_a_runtime_without_the_head(real_drafts, tmp_path):
    """The Markov mutant, served correctly, proposes what the trained draft proposes with its head switched off."""
    import torch

    from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark
    from dspark_hub.train.data.rollouts import RolloutData
    from dspark_hub.train.target.target import Target

    real = real_drafts["speculators"]
    next(m for m in mistakes_for(real.draft, 30) if m.key == "markov_dropped").write(real.draft, tmp_path / "m")
    target = Target.open(real.target)
    embed, lm_head = target.embedding(), target.lm_head().float()
    mutant = SpeculatorsDSpark.from_folder(tmp_path / "m", embed, lm_head)
    headless = SpeculatorsDSpark.from_folder(real.draft, embed, lm_head, markov=False)
    trained = SpeculatorsDSpark.from_folder(real.draft, embed, lm_head)
    rollout = RolloutData(real.heldout_data)[0]
    ids = rollout.input_ids.tolist()
    with torch.no_grad():
        kv = trained.context_kv(trained.context(rollout.aux_hidden_states))
        anchors = range(rollout.prompt_length, len(ids) - 1)
        proposals = [(mutant.propose(kv, ids[p], p, 8), headless.propose(kv, ids[p], p, 8)) for p in anchors]
    assert all(m == h for m, h in proposals)
    bias, _, _ = trained.markov_step(torch.tensor(ids[rollout.prompt_length]), torch.zeros(0), None)
    assert bias.abs().max() > 0     # the trained head adds a bias: the equality above is not vacuous


@pytest.mark.parametrize("case", ["other prompts", "work exists"])
def test_the_bench_refuses_before_any_work(tmp_path, case):
    """bench/real_mistakes.py: prompts that are not the rollouts' own, or a work folder it would replace."""
    data = tmp_path / "data"
    data.mkdir()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "hi"}\n')
    from dspark_hub.format.digests import sha256_file

    digest = "0" * 64 if case == "other prompts" else sha256_file(prompts)
    (data / "manifest.json").write_text(json.dumps({"settings": {"prompts_sha256": digest, "teacher": "t"}}))
    (tmp_path / "work").mkdir()
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "real_mistakes.py"), str(tmp_path / "draft"),
                           "--data", str(data), "--prompts", str(prompts), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert ("is not the prompts file" if case == "other prompts" else "exists; pass --force") in done.stderr
    assert (tmp_path / "work").is_dir() and not any((tmp_path / "work").iterdir())
