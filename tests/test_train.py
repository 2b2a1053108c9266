"""Rollouts -> finetune -> eval -> verify on a tiny real teacher, plus the invariants training rests on."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from dspark_hub.cli.main import cli
from dspark_hub.errors import RefusedOverwriteError, UsageError
from dspark_hub.train import finetune
from dspark_hub.train.data.rollouts import RolloutData, make_rollouts
from dspark_hub.train.finetuning.config import TrainConfig
from dspark_hub.train.finetuning.trainer import Trainer
from dspark_hub.train.finetuning.training_log import MEASURED
from dspark_hub.verify.checks import verify

from .teacher_factory import build_teacher, write_draft_base, write_prompts

REPO = Path(__file__).resolve().parents[1]


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained tiny teacher, a random draft sharing its embedding, train/held-out rollouts."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("world")
    teacher = build_teacher(root / "teacher", steps=150)
    base = write_draft_base(root / "base", teacher)
    write_prompts(root / "train.jsonl", count=96, seed=11)
    write_prompts(root / "heldout.jsonl", count=16, seed=12, dataset="words")
    result = run("rollouts", "--teacher", teacher, "--prompts", root / "train.jsonl", "--draft-config",
                 base / "config.json", "--out", root / "data", "--max-new-tokens", 48, "--batch-size", 32, "--json")
    assert result.exit_code == 0, result.output
    make_rollouts(teacher, root / "heldout.jsonl", base / "config.json", root / "heldout", max_new_tokens=48)
    return {"root": root, "teacher": teacher, "base": base, "data": root / "data", "heldout": root / "heldout",
            "rollouts": json.loads(result.stdout)}


def small_config(world, out: Path, **changes) -> TrainConfig:
    values = dict(base=str(world["base"]), out=str(out), data=str(world["data"]), steps=6, lr=3e-3, batch_size=4,
                  max_anchors=8, warmup=2, seed=3)
    values.update(changes)
    return TrainConfig(**values)


# ----------------------------------------------------------------------------- rollouts


def test_rollouts_are_the_teachers_greedy_path_with_its_states(world):
    from dspark_hub.train.target.generate import capture_states
    from dspark_hub.train.target.target import load_target

    summary = world["rollouts"]
    assert summary["sequences"] == 96 and summary["continuation_tokens"] == 96 * 48
    assert summary["greedy_agreement"] == 1.0
    data = RolloutData(world["data"])
    sample = data[5]
    assert sample.aux_hidden_states.dtype == torch.bfloat16 and sample.aux_hidden_states.shape == (60, 3 * 64)
    assert sample.loss_mask.tolist() == [0] * 12 + [1] * 48
    teacher = load_target(world["teacher"])
    states = capture_states(teacher, sample.input_ids[None], [1, 3, 4])
    assert torch.equal(states.aux_hidden_states[0].to(torch.bfloat16), sample.aux_hidden_states)
    logits = teacher(sample.input_ids[None]).logits[0]
    assert torch.equal(logits[11:-1].argmax(-1), sample.input_ids[12:])
    manifest = data.manifest
    assert manifest["settings"]["target_layer_ids"] == [1, 3, 4]
    assert "hidden_states[l + 1]" in manifest["tap_convention"]


def test_prompts_of_many_lengths_share_a_generate_call_and_continue_as_each_would_alone(world, monkeypatch):
    """`rollouts` left-pads a batch of mixed lengths: one `generate` call, and each row equals its run alone."""
    from dspark_hub.train.target.generate import Prompt, generate_rollouts
    from dspark_hub.train.target.target import load_target

    teacher = load_target(world["teacher"])
    rng = torch.Generator().manual_seed(7)
    prompts = [Prompt(i, torch.randint(10, 70, (length,), generator=rng).tolist(), "words")
               for i, length in enumerate([9, 12, 5, 12, 7, 10])]
    calls = []
    generate = teacher.generate
    monkeypatch.setattr(teacher, "generate", lambda **kw: calls.append(kw["input_ids"].shape) or generate(**kw))
    together = list(generate_rollouts(teacher, prompts, [1, 3, 4], max_new_tokens=16, batch_size=6))
    assert calls == [(6, 12)]
    assert [r.prompt_index for r in together] == [2, 4, 0, 5, 1, 3]       # by prompt length, as before
    for rollout in together:
        alone, = generate_rollouts(teacher, [prompts[rollout.prompt_index]], [1, 3, 4], max_new_tokens=16)
        assert torch.equal(rollout.input_ids, alone.input_ids)
        assert torch.equal(rollout.aux_hidden_states, alone.aux_hidden_states)
        assert torch.equal(rollout.final_hidden_states, alone.final_hidden_states)
        assert rollout.greedy_agreement == alone.greedy_agreement


def test_tap_is_the_output_of_decoder_layer_l_in_ascending_order(tmp_path):
    from transformers import LlamaForCausalLM

    from dspark_hub.train.target.generate import capture_states

    from .teacher_factory import teacher_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(teacher_config()).eval()
    ids = torch.randint(10, 70, (2, 9))
    hooked = {}
    handles = [model.model.layers[i].register_forward_hook(lambda m, a, out, i=i: hooked.__setitem__(i, out))
               for i in range(6)]
    with torch.no_grad():
        hidden_states = model(ids, output_hidden_states=True).hidden_states
    for handle in handles:
        handle.remove()
    states = capture_states(model, ids, [4, 1, 5])
    chunks = states.aux_hidden_states.split(64, dim=-1)
    for chunk, layer in zip(chunks, [1, 4, 5], strict=True):     # ascending ids, whatever the order asked
        output = hooked[layer][0] if isinstance(hooked[layer], tuple) else hooked[layer]
        assert torch.equal(chunk, output)
    assert torch.equal(chunks[0], hidden_states[2]) and torch.equal(chunks[1], hidden_states[5])
    assert not torch.allclose(chunks[2], hidden_states[6], atol=1e-3)   # last entry is final-normed
    assert torch.allclose(states.final_hidden_states, hidden_states[6], atol=1e-6)


def test_rollouts_refuse_a_teacher_that_does_not_fit_the_draft(world, tmp_path):
    from transformers import LlamaForCausalLM

    from .teacher_factory import teacher_config

    for key, value in (("hidden_size", 32), ("num_hidden_layers", 5), ("vocab_size", 600)):
        folder = tmp_path / key
        LlamaForCausalLM(teacher_config(**{key: value})).save_pretrained(str(folder))
        result = run("rollouts", "--teacher", folder, "--prompts", world["root"] / "heldout.jsonl",
                     "--draft-config", world["base"] / "config.json", "--out", tmp_path / f"out-{key}")
        assert result.exit_code == 2
        assert f"{key} is {value}" in result.output and len(result.output.strip().splitlines()) == 1
        assert not (tmp_path / f"out-{key}").exists()


def test_rollouts_resume_skips_written_prompts_and_equals_a_fresh_run(world, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", count=6, seed=21)
    config = world["base"] / "config.json"
    fresh = make_rollouts(world["teacher"], prompts, config, tmp_path / "fresh", max_new_tokens=8, shard_size=2)
    assert fresh.written == 6 and fresh.shards == 3
    # An interrupted run: only the first shard made it into the manifest.
    partial = tmp_path / "partial"
    make_rollouts(world["teacher"], prompts, config, partial, max_new_tokens=8, shard_size=2)
    manifest = json.loads((partial / "manifest.json").read_text())
    manifest["shards"] = manifest["shards"][:1]
    (partial / "manifest.json").write_text(json.dumps(manifest))
    resumed = make_rollouts(world["teacher"], prompts, config, partial, max_new_tokens=8, shard_size=2)
    assert (resumed.skipped, resumed.written, resumed.sequences) == (2, 4, 6)
    again = make_rollouts(world["teacher"], prompts, config, partial, max_new_tokens=8, shard_size=2)
    assert (again.skipped, again.written) == (6, 0)
    a = {r.prompt_index: r for r in RolloutData(tmp_path / "fresh")}
    b = {r.prompt_index: r for r in RolloutData(partial)}
    assert sorted(a) == sorted(b) == list(range(6))
    for i in a:
        assert torch.equal(a[i].input_ids, b[i].input_ids)
        assert torch.equal(a[i].aux_hidden_states, b[i].aux_hidden_states)
    with pytest.raises(RefusedOverwriteError, match="setting max_new_tokens was 8 and is now 9"):
        make_rollouts(world["teacher"], prompts, config, partial, max_new_tokens=9)


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def tuned(world, tmp_path_factory):
    """The pipeline, run once: finetune 100 steps (held-out eval every 50), then eval against the base.

    Each step's promises are the small tests below, so a failure names the step that broke.
    """
    root = tmp_path_factory.mktemp("tuned")
    out = root / "tuned"
    trained = run("finetune", "--base", world["base"], "--data", world["data"], "--out", out, "--steps", 100,
                  "--lr", 3e-3, "--warmup", 10, "--batch-size", 8, "--anchors", 16,
                  "--eval-data", world["heldout"], "--eval-every", 50, "--json")
    assert trained.exit_code == 0, trained.output
    evaluation = run("eval", "--draft", out, "--target", world["teacher"], "--prompts",
                     world["root"] / "heldout.jsonl", "--max-new-tokens", 48, "--reference", world["base"], "--json")
    assert evaluation.exit_code == 0, evaluation.output
    (root / "eval.json").write_text(evaluation.stdout)
    return {"out": out, "trained": json.loads(trained.stdout), "eval": json.loads(evaluation.stdout),
            "eval_path": root / "eval.json"}


@pytest.mark.slow
def test_finetune_reports_the_steps_and_tokens_it_ran(tuned):
    assert tuned["trained"]["steps"] == 100 and tuned["trained"]["tokens"] == 100 * 8 * 48


@pytest.mark.slow
def test_finetune_raises_held_out_acceptance_well_above_the_base(tuned):
    doc = tuned["eval"]
    before, after = doc["reference"]["acceptance_length"], doc["acceptance_length"]
    assert before < 1.2 and after > before + 1.0, (before, after)
    assert doc["reference"]["ratio"] == pytest.approx(after / before)


@pytest.mark.slow
def test_eval_counts_follow_vllms_definitions(tuned):
    doc = tuned["eval"]
    after, rates = doc["acceptance_length"], doc["per_position"]
    assert all(a >= b for a, b in itertools.pairwise(rates)) and rates[0] > rates[-1] + 0.3
    assert after == pytest.approx(1 + sum(rates))
    assert after == pytest.approx(1 + sum(doc["accepted_per_position"]) / doc["drafts"])
    assert doc["prompts"] == 16 and doc["tokens"] == 16 * 48
    assert doc["engine"] == "simulated" and doc["k"] == 7 and doc["measured_by"] is None and doc["ok"]


@pytest.mark.slow
def test_eval_reports_the_baseline_per_dataset_and_its_harness(world, tuned):
    from dspark_hub.train.target.target import sha256_file

    doc = tuned["eval"]
    assert set(doc["by_dataset"]) == {"words"} and doc["by_dataset"]["words"]["baseline"]["drafts"] > 0
    assert doc["baseline"]["acceptance_length"] > 1.0 and "prompt lookup" in doc["baseline"]["method"]
    harness = doc["harness"]
    assert (harness["mode"], harness["decoding"], harness["block_size"]) == ("simulated", "greedy", 7)
    assert harness["definition"] == doc["definition"] and "1 + sum(per_position)" in doc["definition"]
    assert set(harness["teacher_identity"]["digests"]) == {"config.json", "model.safetensors"}
    assert harness["teacher"].startswith("teacher (sha256 config.json ") and "ratio" in harness["reference"]
    assert harness["prompts_sha256"] == sha256_file(world["root"] / "heldout.jsonl")


@pytest.mark.slow
def test_the_card_reads_the_eval_naming_target_and_reference_by_digest_never_by_path(world, tuned):
    from dspark_hub.cards.results import load_eval
    from dspark_hub.train.target.target import sha256_file

    doc, harness = tuned["eval"], tuned["eval"]["harness"]
    card = dict(load_eval(tuned["eval_path"]).by_dataset.harness)
    assert (card["measurement"], card["decoding"], card["block size"]) == ("simulated", "greedy", "7")
    assert card["teacher"] == harness["teacher"].removeprefix("teacher (").removesuffix(")")
    base_sha = sha256_file(world["base"] / "model.safetensors")
    assert doc["reference"]["identity"]["sha256"]["model.safetensors"] == base_sha
    assert str(world["base"]) not in harness["reference"] and f"model.safetensors {base_sha[:12]}" in card["reference"]
    assert card["reference"] == harness["reference"] and card["reference"].startswith("sha256 config.json ")


@pytest.mark.slow
def test_the_held_out_rollouts_folder_measures_nearly_what_the_prompts_do(world, tuned):
    """bfloat16 taps, and no tokens past the folder's end: nearly the same measurement."""
    from dspark_hub.train.evaluation.evaluate import evaluate

    measured = evaluate(tuned["out"], data=str(world["heldout"])).to_dict()["acceptance_length"]
    assert measured == pytest.approx(tuned["eval"]["acceptance_length"], abs=0.15)


@pytest.mark.slow
def test_the_tuned_draft_stays_a_drop_in_with_its_embedding_and_config_untouched(world, tuned):
    out = tuned["out"]
    report = verify(out, drop_in=str(world["base"]))
    assert report.ok, [f.to_dict() for f in report.errors]
    tuned_weights, base = load_file(str(out / "model.safetensors")), load_file(str(world["base"] / "model.safetensors"))
    assert torch.equal(tuned_weights["embed_tokens.weight"], base["embed_tokens.weight"])
    assert not torch.equal(tuned_weights["context_proj.weight"], base["context_proj.weight"])
    assert (out / "config.json").read_bytes() == (world["base"] / "config.json").read_bytes()


@pytest.mark.slow
def test_the_training_log_holds_every_step_and_both_evals(tuned):
    from dspark_hub.cards.results import load_train_log

    out = tuned["out"]
    assert [row.step for row in load_train_log(out / "training_log.jsonl")[0]] == [50, 100]
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    steps = [e for e in log if "loss" in e]
    assert [e["step"] for e in steps] == list(range(1, 101))
    assert {"ce", "tv", "confidence", "lr", "grad_norm"} <= set(steps[0])
    evals = [e for e in log if "eval" in e]
    assert [e["step"] for e in evals] == [50, 100]
    assert evals[-1]["eval"]["acceptance_length"] == pytest.approx(tuned["eval"]["acceptance_length"], abs=0.15)


def test_eval_plot_names_its_missing_dependency(world, tmp_path):
    try:
        import matplotlib  # noqa: F401
        pytest.skip("matplotlib is installed here")
    except ImportError:
        pass
    result = run("eval", "--draft", world["base"], "--data", world["heldout"], "--plot", tmp_path / "a.png")
    assert result.exit_code == 2 and "matplotlib" in result.output


# ----------------------------------------------------------------------------- invariants


def test_a_block_in_the_packed_training_batch_equals_single_block_inference(world):
    from dspark_hub.modeling import load_checkpoint
    from dspark_hub.train.finetuning import objective
    from dspark_hub.train.target.target import Target

    model = load_checkpoint(world["base"], dtype=torch.float32).model.eval()
    lm_head = Target.open(world["teacher"]).lm_head().float()
    data = RolloutData(world["data"])
    short, long = data[0], data[1]
    short.input_ids, short.aux_hidden_states = short.input_ids[:40], short.aux_hidden_states[:40]
    short.final_hidden_states, short.mask = short.final_hidden_states[:40], short.mask[:40]
    anchors = [torch.tensor([14, 25, 30]), torch.tensor([12, 20])]
    batch = objective.collate([short, long], anchors)     # short is padded; long has a padded anchor slot
    with torch.no_grad():
        packed = model.teacher_forced(batch.context_states, batch.input_ids, batch.anchors, block_size=7,
                                      lm_head_weight=lm_head, doc_ids=batch.doc_ids, anchor_valid=batch.anchor_valid)
        for row, sample in enumerate([short, long]):
            for j, anchor in enumerate(anchors[row].tolist()):
                single = model.propose_block(sample.aux_hidden_states[None, :anchor].float(),
                                             sample.input_ids[anchor:anchor + 1], lm_head, block_size=7)
                assert torch.allclose(packed.last_hidden_state[row, j], single.last_hidden_state[0], atol=1e-5)
                assert torch.equal(packed.logits[row, j, 0].argmax(), single.tokens[0, 0])
        perturbed = batch.context_states.clone()
        perturbed[0, 25:] += 3.0                           # after the second anchor of row 0
        moved = model.teacher_forced(perturbed, batch.input_ids, batch.anchors, block_size=7,
                                     doc_ids=batch.doc_ids, anchor_valid=batch.anchor_valid).last_hidden_state
    assert torch.equal(moved[0, :2], packed.last_hidden_state[0, :2])
    assert not torch.allclose(moved[0, 2], packed.last_hidden_state[0, 2])
    assert torch.equal(moved[1], packed.last_hidden_state[1])


def _fp32_state(state_dir: Path) -> dict[str, torch.Tensor]:
    pointer = json.loads((state_dir / "latest.json").read_text())
    return torch.load(state_dir / pointer["file"], weights_only=False)["model"]


@pytest.mark.slow
def test_resume_from_a_mid_run_state_reproduces_the_uninterrupted_run(world, tmp_path):
    whole = small_config(world, tmp_path / "whole", save_every=3)
    finetune(whole)

    class Interrupt(Exception):
        pass

    calls = 0

    def stop_after_three(_n):
        nonlocal calls
        calls += 1
        if calls == 4:
            raise Interrupt

    broken = small_config(world, tmp_path / "broken", save_every=3)
    with pytest.raises(Interrupt):
        finetune(broken, progress=stop_after_three)
    assert not (tmp_path / "broken").exists()
    finetune(small_config(world, tmp_path / "broken", save_every=3, resume=True))
    a, b = _fp32_state(Path(f"{tmp_path}/whole.state")), _fp32_state(Path(f"{tmp_path}/broken.state"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    def values(run: str) -> list[dict]:     # the log minus what the machine measured (time, memory)
        lines = (tmp_path / run / "training_log.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k not in MEASURED} for line in lines]
    log_a, log_b = values("whole"), values("broken")
    assert log_a == log_b and len(log_a) == 6


def _state_names(state_dir: Path) -> list[str]:
    return sorted(p.name for p in state_dir.iterdir() if p.suffix == ".pt")


def test_states_rotate_to_the_newest_n_and_resume_after_rotation_reproduces_the_run(world, tmp_path):
    whole = finetune(small_config(world, tmp_path / "whole", save_every=1, keep_states=2))
    state_dir = Path(whole.state_dir)
    assert _state_names(state_dir) == ["step-000005.pt", "step-000006.pt"]
    assert whole.states == ("step-000005.pt", "step-000006.pt")
    assert json.loads((state_dir / "latest.json").read_text()) == {"step": 6, "file": "step-000006.pt"}

    class Interrupt(Exception):
        pass

    calls = 0

    def stop_after_four(_n):
        nonlocal calls
        calls += 1
        if calls == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        finetune(small_config(world, tmp_path / "broken", save_every=1, keep_states=2), progress=stop_after_four)
    broken_states = Path(f"{tmp_path}/broken.state")
    assert _state_names(broken_states) == ["step-000003.pt", "step-000004.pt"]      # stopped before step 5's state
    (broken_states / ".step-000006.pt.tmp-dead").write_bytes(b"half a state")        # a crash mid-write
    resumed = finetune(small_config(world, tmp_path / "broken", save_every=1, keep_states=2, resume=True))
    assert resumed.steps == 6 and _state_names(broken_states) == ["step-000005.pt", "step-000006.pt"]
    assert not list(broken_states.glob(".step-*"))
    a, b = _fp32_state(state_dir), _fp32_state(broken_states)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    everything = finetune(small_config(world, tmp_path / "all", save_every=2, keep_states=0))
    assert everything.states == ("step-000002.pt", "step-000004.pt", "step-000006.pt")
    assert run("finetune", "--base", world["base"], "--out", tmp_path / "x", "--keep-states", -1).exit_code == 2


def test_rotation_never_leaves_zero_complete_states(tmp_path):
    from dspark_hub.train.finetuning.checkpointer import rotate_states, state_files

    for step in (2, 4, 6):
        (tmp_path / f"step-{step:06d}.pt").write_bytes(b"state")
    (tmp_path / "step-000008.pt.partial").write_bytes(b"")         # not a state name: left alone
    removed = rotate_states(tmp_path, 1, latest="step-000006.pt")
    assert [p.name for p in removed] == ["step-000002.pt", "step-000004.pt"]
    assert [p.name for p in state_files(tmp_path)] == ["step-000006.pt"]
    assert rotate_states(tmp_path, 1, latest="step-000006.pt") == []
    assert [p.name for p in state_files(tmp_path)] == ["step-000006.pt"]


def test_no_state_folder_unless_states_are_asked_for_and_the_log_still_lands_in_the_output(world, tmp_path):
    plain = run("finetune", "--base", world["base"], "--data", world["data"], "--out", tmp_path / "plain",
                "--steps", 2, "--batch-size", 4, "--anchors", 4, "--json")
    assert plain.exit_code == 0, plain.output
    doc = json.loads(plain.stdout)
    assert doc["state_dir"] is None and doc["states"] == []
    assert not (tmp_path / "plain.state").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]
    out = tmp_path / "plain"
    assert [json.loads(line)["step"] for line in (out / "training_log.jsonl").read_text().splitlines()] == [1, 2]
    assert json.loads((out / "training_args.json").read_text())["keep_states"] == 2
    chosen = run("finetune", "--base", world["base"], "--data", world["data"], "--out", tmp_path / "chosen",
                 "--steps", 2, "--batch-size", 4, "--anchors", 4, "--state-dir", tmp_path / "states", "--json")
    assert chosen.exit_code == 0, chosen.output
    assert json.loads(chosen.stdout)["state_dir"] == str(tmp_path / "states")
    assert sorted(p.name for p in (tmp_path / "states").iterdir()) == ["training_log.jsonl"]    # asked for: kept
    assert (tmp_path / "chosen" / "training_log.jsonl").read_text() == (tmp_path / "states" / "training_log.jsonl"
                                                                        ).read_text()


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_process_torchrun_equals_one_process_on_the_same_global_batch(world, tmp_path, sharding):
    single = small_config(world, tmp_path / "single", save_every=6)
    finetune(single)
    out = tmp_path / "pair"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "dspark_hub", "finetune", "--base", world["base"], "--data", world["data"], "--out", out,
               "--steps", 6, "--lr", 3e-3, "--batch-size", 4, "--anchors", 8, "--warmup", 2, "--seed", 3,
               "--save-every", 6, "--quiet"] + (["--fsdp"] if sharding == "fsdp" else [])
    done = subprocess.run([str(c) for c in command], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = _fp32_state(Path(f"{tmp_path}/single.state")), _fp32_state(Path(f"{out}.state"))
    for name in a:
        assert torch.allclose(a[name], b[name], atol=2e-5, rtol=1e-4), name
    moved = max((a[n] - load_file(str(world["base"] / "model.safetensors"))[n.removeprefix("model.")].float())
                .abs().max().item() for n in a)
    assert moved > 1e-3           # the steps did train
    assert verify(out, drop_in=str(world["base"])).ok


@pytest.mark.slow
def test_on_policy_rounds_alternate_teacher_rollouts_and_updates(world, tmp_path, monkeypatch):
    from dspark_hub.format.digests import sha256_file
    from dspark_hub.train.target import target as target_module

    hashed: list[str] = []
    monkeypatch.setattr(target_module, "sha256_file", lambda path: hashed.append(Path(path).name) or sha256_file(path))
    prompts = write_prompts(tmp_path / "p.jsonl", count=8, seed=31)
    config = small_config(world, tmp_path / "onpolicy", data=None, on_policy=True, rounds=2, prompts=str(prompts),
                          target=str(world["teacher"]), max_new_tokens=16, steps=4)
    result = finetune(config)
    assert sorted(hashed) == ["config.json", "model.safetensors"]      # the target's identity: once for both rounds
    state = Path(result.state_dir)
    assert [len(RolloutData(state / f"round-{r:03d}" / "data")) for r in (0, 1)] == [4, 4]
    log = [json.loads(line) for line in (tmp_path / "onpolicy" / "training_log.jsonl").read_text().splitlines()]
    assert [(e["step"], e["round"]) for e in log if "loss" in e] == [(1, 0), (2, 0), (3, 1), (4, 1)]
    released = [e for e in log if "release" in e]
    assert [(e["step"], e["round"], e["engine"]) for e in released] == [(0, 0, "transformers")]
    assert result.engine_releases == (released[0]["release"],) and "unloaded" in released[0]["release"]
    assert verify(tmp_path / "onpolicy", drop_in=str(world["base"])).ok


def test_finetune_refuses_an_existing_output_before_training(world, tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(RefusedOverwriteError, match="already exists"):
        Trainer(small_config(world, tmp_path / "taken"))


def test_prompts_render_messages_with_the_chat_template_and_text_with_the_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from dspark_hub.train.data.rollouts import read_prompts

    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "user:", "assistant:", "hello", "world", "\n"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>")
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} {% endfor %}"
                               "{% if add_generation_prompt %}assistant: {% endif %}")
    tokenizer.save_pretrained(str(tmp_path / "teacher"))
    (tmp_path / "teacher" / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(vocab)}))
    lines = [{"messages": [{"role": "user", "content": "hello world"}], "dataset": "chat"},
             {"text": "world hello"}, {"input_ids": [5, 6, 7]}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    prompts = read_prompts(tmp_path / "p.jsonl", tmp_path / "teacher")
    assert prompts[0].input_ids == [3, 5, 6, 4] and prompts[0].dataset == "chat"
    assert prompts[1].input_ids == [6, 5] and prompts[2].input_ids == [5, 6, 7]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "a", "input_ids": [1]}) + "\n")
    with pytest.raises(UsageError, match=r"bad.jsonl:1: needs exactly one of"):
        read_prompts(tmp_path / "bad.jsonl", tmp_path / "teacher")


def _linear_output_dtypes(trainer: Trainer) -> set[torch.dtype]:
    """Dtypes the first layer's MLP projection produces during training (recorded by a forward hook)."""
    seen: set[torch.dtype] = set()
    trainer.model.layers[0].mlp.down_proj.register_forward_hook(lambda module, args, out: seen.add(out.dtype))
    return seen


def test_bf16_autocast_and_epochs_train_to_a_drop_in(world, tmp_path):
    fp32 = Trainer(small_config(world, tmp_path / "fp32", steps=1))
    fp32_dtypes = _linear_output_dtypes(fp32)
    fp32.run_steps(RolloutData(world["data"]), 0, 1)
    assert fp32_dtypes == {torch.float32}        # the twin: without bf16 the forward stays float32
    config = small_config(world, tmp_path / "bf16", steps=None, epochs=0.25, batch_size=8, dtype="bf16")
    trainer = Trainer(config)
    bf16_dtypes = _linear_output_dtypes(trainer)
    result = trainer.fit()
    assert bf16_dtypes == {torch.bfloat16}       # the forward ran under bf16 autocast ...
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}    # ... over fp32 master weights
    assert result.steps == 3                     # 96 sequences / 8 per step = 12 steps per epoch
    log = [json.loads(line) for line in (tmp_path / "bf16" / "training_log.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in log) and len(log) == 3
    assert verify(tmp_path / "bf16", drop_in=str(world["base"])).ok


def test_a_chunked_loss_trains_the_same_weights_as_the_whole_vocabulary_loss(world, tmp_path):
    data = RolloutData(world["data"])
    trained = {}
    for chunk in (0, 5, 409):
        trainer = Trainer(small_config(world, tmp_path / f"chunk-{chunk}", loss_chunk=chunk, steps=2,
                                       loss={"ce": 0.1, "kl": 0.2, "tv": 0.9}))
        trainer.run_steps(data, 0, 2)
        log = trainer.log_text().splitlines()
        trained[chunk] = ({n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                          [json.loads(line) for line in log])
    whole, whole_log = trained[0]
    base = load_file(str(world["base"] / "model.safetensors"))
    assert max((whole[n] - base[n].float()).abs().max().item() for n in whole) > 1e-3     # the steps did train
    for chunk in (5, 409):
        weights, log = trained[chunk]
        for name, value in whole.items():
            assert torch.allclose(weights[name], value, rtol=1e-5, atol=1e-6), (chunk, name)
        for a, b in zip(whole_log, log, strict=True):
            assert a.keys() == b.keys()
            for key in ("loss", "ce", "kl", "tv", "confidence", "accuracy", "overlap", "grad_norm"):
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (chunk, key)
    with pytest.raises(UsageError, match=r"^loss_chunk: -1; "):
        Trainer(small_config(world, tmp_path / "negative", loss_chunk=-1))
    assert run("finetune", "--base", world["base"], "--out", tmp_path / "x", "--loss-chunk", -1).exit_code == 2


def test_the_device_defaults_to_cuda_only_when_torch_sees_one_and_a_missing_one_is_refused():
    from dspark_hub.train.finetuning.distributed import resolve_device

    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="device 'cuda': torch sees no CUDA device here; use cpu"):
            resolve_device("cuda")
    with pytest.raises(UsageError, match="device 'gpu0': not a torch device"):
        resolve_device("gpu0")


def test_every_step_logs_its_time_throughput_and_peak_memory_on_the_device(world, tmp_path):
    result = finetune(small_config(world, tmp_path / "m", steps=2, device="cpu"))
    assert result.device == "cpu" and result.peak_memory_bytes > 100 << 20
    log = [json.loads(line) for line in (tmp_path / "m" / "training_log.jsonl").read_text().splitlines()]
    for entry in log:
        assert entry["device"] == "cpu" and entry["step_seconds"] > 0 and entry["peak_memory_bytes"] > 0
        assert entry["tokens_per_second"] == pytest.approx(entry["tokens"] / entry["step_seconds"])
    assert set(MEASURED) <= set(log[0])


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_a_torchrun_resume_reads_the_state_on_rank_0_only_and_reproduces_the_run(world, tmp_path, sharding):
    """Rank 0 loads the state file and broadcasts it; the other ranks never read it."""
    script = tmp_path / "run.py"
    script.write_text(
        "import os, runpy, sys, torch\n"
        "load = torch.load\n"
        "def source(file):\n"
        "    if isinstance(file, (str, os.PathLike)):\n"
        "        return str(file)\n"
        "    try:   # a file the product opened; broadcast objects arrive as buffers (no descriptor)\n"
        "        return os.readlink(f'/proc/self/fd/{file.fileno()}')\n"
        "    except (OSError, ValueError, AttributeError):\n"
        "        return None\n"
        "def logged(file, *args, **kwargs):\n"
        "    if source(file) is not None:\n"
        "        with open(os.environ['LOAD_LOG'] + '.' + os.environ['RANK'], 'a') as log:\n"
        "            log.write(source(file) + '\\n')\n"
        "    return load(file, *args, **kwargs)\n"
        "torch.load = logged\n"
        "sys.argv = ['dspark_hub', *sys.argv[1:]]\n"
        "runpy.run_module('dspark_hub', run_name='__main__')\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "LOAD_LOG": str(tmp_path / "loads")}

    def pair(out: Path, *extra: object) -> None:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script,
                   "finetune", "--base", world["base"], "--data", world["data"], "--out", out, "--steps", 6, "--lr",
                   3e-3, "--batch-size", 4, "--anchors", 8, "--warmup", 2, "--seed", 3, "--save-every", 3,
                   "--keep-states", 0, "--quiet", *extra] + (["--fsdp"] if sharding == "fsdp" else [])
        done = subprocess.run([str(c) for c in command], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

    pair(tmp_path / "whole")
    states = tmp_path / "resumed.state"
    states.mkdir()
    shutil.copy(Path(f"{tmp_path}/whole.state") / "step-000003.pt", states)   # as if killed after step 3
    (states / "latest.json").write_text(json.dumps({"step": 3, "file": "step-000003.pt"}))
    pair(tmp_path / "resumed", "--resume")
    reads = {rank: (tmp_path / f"loads.{rank}").read_text().split() if (tmp_path / f"loads.{rank}").exists() else []
             for rank in (0, 1)}
    assert [Path(f).name for f in reads[0]] == ["step-000003.pt"] and reads[1] == [], reads
    a, b = _fp32_state(Path(f"{tmp_path}/whole.state")), _fp32_state(states)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6, rtol=1e-5), name


def test_a_run_leaves_the_process_group_it_joined_and_keeps_one_joined_before(world, tmp_path, monkeypatch):
    """A gloo group left to the interpreter's exit can abort a rank after a good run (SIGABRT): `finetune` leaves
    the group its trainer joined, and only that one. One rank in this process, started as torchrun starts it."""
    import torch.distributed as dist

    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}.items():   # port 0: a free one
        monkeypatch.setenv(name, value)
    joined: list[int] = []
    monkeypatch.setattr(Trainer, "fit", lambda self: joined.append(dist.get_world_size()) or "ran")
    assert finetune(small_config(world, tmp_path / "joined-here")) == "ran"
    assert joined == [1] and not dist.is_initialized()        # the trainer joined a group; the run left it
    dist.init_process_group("gloo")
    try:
        assert finetune(small_config(world, tmp_path / "joined-before")) == "ran"
        assert joined == [1, 1] and dist.is_initialized()     # the caller's group stays the caller's
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("device, backend", [("cpu", "gloo"), ("cuda:1", "nccl")])
def test_dist_timeout_reaches_the_process_group(monkeypatch, device, backend):
    from datetime import timedelta

    from dspark_hub.train.finetuning import distributed
    joined: list[dict] = []
    monkeypatch.setattr(distributed, "launched_by_torchrun", lambda: True)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: bool(joined))
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kwargs: joined.append(kwargs))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)
    assert distributed.init_distributed(torch.device(device), 90) == (1, 2)
    (kwargs,) = joined
    assert kwargs["backend"] == backend and kwargs["timeout"] == timedelta(minutes=90)
    assert kwargs.get("device_id") == (torch.device(device) if backend == "nccl" else None)


# ----------------------------------------------------------------------------- the behaviour probe on the toy world


@pytest.fixture(scope="module")
def probed(world, tuned, tmp_path_factory):
    """`dspark-hub probe`'s matrix on the toy world (docs/probe.md): the tuned draft, each mistake made to it as a
    user would (bench/_probe_matrix.py) and the untrained base, judged on one set of the teacher's greedy paths."""
    sys.path.insert(0, str(REPO / "bench"))
    from _probe_matrix import mutants

    from dspark_hub.train.evaluation.greedy_paths import greedy_paths
    from dspark_hub.train.evaluation.probe import judge, plan_probe
    from dspark_hub.train.target.target import Target

    target = Target.open(world["teacher"])
    rows = mutants(tuned["out"], world["base"], tmp_path_factory.mktemp("probe"), 6)
    plans = {row.name: plan_probe(row.draft, target, block_size=row.block_size) for row in rows}
    paths = greedy_paths(target, set().union(*(p.layers for p in plans.values())),
                         prompts=world["root"] / "heldout.jsonl",
                         max_new_tokens=48 + max(p.longest for p in plans.values()))
    return {row.name: (row, judge(plans[row.name], paths)) for row in rows}


#: What the probe must name on the toy world (every other convention of a row: "as declared" or "cannot tell").
TOY_NAMED = {"trained": {"taps": "as declared", "markov": "as declared", "rope": "as declared"},
             "taps shifted +1": {"taps": "one layer earlier"},
             "Markov output zeroed": {"markov": "without"},
             "RoPE rows half-split": {"rope": "half-split"}}


@pytest.mark.slow
def test_the_probe_names_the_toy_drafts_conventions(probed):
    sys.path.insert(0, str(REPO / "bench"))
    from _probe_matrix import CONVENTIONS, matches, verdict_of

    assert set(probed) == {"trained", "taps shifted +1", "Markov output zeroed", "RoPE rows half-split",
                           "served k = 9", "untrained base"}
    for name, (row, result) in probed.items():
        said = {key: verdict_of(result, key) for key in CONVENTIONS}
        assert all(matches(row.truth, result, key) for key in CONVENTIONS), (name, said)   # never a wrong value
        for key, value in TOY_NAMED.get(name, {}).items():
            assert said[key] == value, (name, said)
    base = probed["untrained base"][1]
    assert not base.untrained.trained and {c.verdict for c in base.conventions} == {"cannot tell"}


@pytest.mark.slow
def test_a_probe_that_trusts_the_config_fails_the_toy_matrix(probed):
    """The twin: answering "as declared" everywhere gets every mutant wrong."""
    sys.path.insert(0, str(REPO / "bench"))
    from _probe_matrix import matches

    class Trusting:
        def __init__(self, result):
            self.conventions = [type(c)(**{**c.__dict__, "verdict": "as declared", "follows": c.declared})
                                for c in result.conventions]

    wrong = {name for name, (row, result) in probed.items()
             if not all(matches(row.truth, Trusting(result), key) for key in row.truth or {"taps": ""})}
    assert wrong == {"taps shifted +1", "Markov output zeroed", "RoPE rows half-split", "served k = 9",
                     "untrained base"}


@pytest.mark.slow
def test_a_probe_that_names_the_highest_raw_value_fails_the_toy_matrix(probed):
    """The other twin: naming whichever reading has the highest mean, without the paired statistic and the untrained
    level, keeps an inert Markov head (its readings tie exactly: no mean is higher) and names values on the untrained
    base, whose readings differ only as random functions do."""
    sys.path.insert(0, str(REPO / "bench"))
    from _probe_matrix import CONVENTIONS, matches

    class Greedy:
        def __init__(self, result):
            self.conventions = []
            for c in result.conventions:
                best = max(c.scores, key=lambda s: s.expected_accepted)
                named = best.value == c.declared
                self.conventions.append(type(c)(**{**c.__dict__, "verdict": "as declared" if named else "other",
                                                   "follows": best.value}))

    wrong = {name for name, (row, result) in probed.items()
             if not all(matches(row.truth, Greedy(result), key) for key in CONVENTIONS)}
    assert {"Markov output zeroed", "untrained base"} <= wrong, wrong
    assert all(matches(row.truth, result, key) for row, result in probed.values() for key in CONVENTIONS)
