"""`finetune --base B` for a speculators DSpark: every data source, drop-in output, frozen bytes, refusals.

The bases are the checked-in checkpoints speculators 0.9.0 saved (`tests/spec_fixtures.py`), the
target their tiny Qwen3 verifier. The data are recorded from it three ways: our rollouts
(`rollouts --draft-config B/config.json`), files in vLLM's extraction layout (the taps and the last
layer's pre-norm output, captured with forward hooks as vLLM captures them) and speculators' own
`prepare-data` + `generate-offline-data` output (`fixtures/speculators_sample`, recorded against
another tiny target of the same shape, so it is read with a copy of B tapping the layers it holds).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from dspark_hub.cli.main import cli
from dspark_hub.format.tensorio import tensor_files
from dspark_hub.train import finetune
from dspark_hub.train.data.hidden_state_files import write_hidden_state_file
from dspark_hub.train.data.rollouts import RolloutData, make_rollouts
from dspark_hub.train.finetuning.config import TrainConfig

from .cli_errors import assert_one_line_error
from .progress_recorder import RecordedProgress
from .spec_fixtures import VERIFIER, add, copy_fixture, drop, edit_config, edit_tensors, fixture, reshape, set_key

SAMPLE = Path(__file__).parent / "fixtures" / "speculators_sample"
TARGET = str(VERIFIER)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="dspark-hub")


def _sequences(count: int = 8, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 250, (int(n),), generator=generator).tolist()
            for n in torch.randint(14, 22, (count,), generator=generator)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The three data sources, recorded from the verifier at B's taps (aux ids [1, 3, 5] = our [0, 2, 4])."""
    from transformers import AutoModelForCausalLM

    from dspark_hub.train.target.generate import capture_states

    root = tmp_path_factory.mktemp("specft")
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": ids}) + "\n" for ids in _sequences()))
    make_rollouts(TARGET, prompts, fixture("dspark") / "config.json", root / "rollouts", max_new_tokens=6)
    model = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    (root / "vllm").mkdir()
    for i, ids in enumerate(_sequences(seed=1)):
        states = capture_states(model, torch.tensor([ids]), [0, 2, 4, 5])     # vLLM aux ids 1, 3, 5 and the last, 6
        write_hidden_state_file(root / "vllm" / f"req-{i}.safetensors",
                                states.aux_hidden_states[0].view(len(ids), 4, 64).to(torch.bfloat16),
                                torch.tensor(ids))
    return {"rollouts": root / "rollouts", "vllm": root / "vllm", "speculators": SAMPLE, "prompts": prompts}


def _base_for(source: str, tmp_path: Path, name: str = "dspark") -> Path:
    """B itself, or (for the speculators sample, captured at aux ids [2, 4, 5]) a copy of B tapping those."""
    if source != "speculators":
        return fixture(name)
    return edit_config(copy_fixture(tmp_path, name, "base"), set_key("aux_hidden_state_layer_ids", [2, 4, 5]))


def _train(base: Path, data_path: Path, out: Path, **options):
    config = TrainConfig(base=str(base), out=str(out), data=str(data_path), target=TARGET,
                         **{"steps": 10, "lr": 3e-3, "batch_size": 4, "loss": {"kl_div": 1.0}, **options})
    return finetune(config)


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]


def _raw(folder: Path) -> dict[str, tuple[str, bytes]]:
    """Tensor name -> (file name, raw bytes) of a checkpoint folder."""
    out = {}
    for name, file in tensor_files(folder).items():
        with safe_open(str(file), "pt") as handle:
            tensor = handle.get_tensor(name)
        out[name] = (file.name, tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return out


def _assert_drop_in(out: Path, base: Path) -> None:
    result = run("verify", out, "--drop-in", base)
    assert result.exit_code == 0, result.output + result.stderr
    assert (out / "config.json").read_bytes() == (base / "config.json").read_bytes()
    for file in base.glob("*.safetensors"):        # same header bytes: names, dtypes, offsets, __metadata__
        head = file.read_bytes()[:8 + int.from_bytes(file.read_bytes()[:8], "little")]
        assert (out / file.name).read_bytes()[:len(head)] == head, file.name


@pytest.mark.slow
@pytest.mark.parametrize(("batch_size", "anchors"), [(4, 2), (2, 2), (4, 3)])
def test_anchors_mean_anchors_per_sequence_as_for_k3_dspark(data, tmp_path, batch_size, anchors):
    """`--anchors N` supervises N per sequence: the library draws N x the row's sequences over the packed row (its
    `max_anchors` counts a row), so `--batch-size 4 --anchors 2` draws 8, where it drew 2."""
    _train(fixture("dspark"), data["rollouts"], tmp_path / "out", steps=2, batch_size=batch_size, max_anchors=anchors)
    assert [e["anchors"] for e in _log(tmp_path / "out") if "loss" in e] == [batch_size * anchors] * 2


@pytest.mark.slow
@pytest.mark.parametrize("source", ["rollouts", "vllm", "speculators"])
def test_each_data_source_trains_the_loss_down_into_a_drop_in_checkpoint(data, source, tmp_path):
    base = _base_for(source, tmp_path)
    result = _train(base, data[source], tmp_path / "out")
    losses = [e["loss"] for e in _log(tmp_path / "out") if "loss" in e]
    assert len(losses) == result.steps == 10 and result.tokens > 0
    assert sum(losses[-3:]) < sum(losses[:3]), losses
    _assert_drop_in(tmp_path / "out", base)
    before, after = _raw(base), _raw(tmp_path / "out")
    assert before["fc.weight"] != after["fc.weight"]          # trained, and cast back to B's dtype (drop-in above)


@pytest.mark.slow
def test_the_rollouts_record_bs_aux_ids_in_our_convention(data):
    settings = RolloutData(data["rollouts"]).manifest["settings"]
    assert settings["target_layer_ids"] == [0, 2, 4]          # aux ids [1, 3, 5] through format.taps
    assert settings["target_hidden_size"] == 64


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dspark-pruned-vocab", "dspark-sharded", "dspark-f32", "dspark-bonus-anchor",
                                  "dspark-markov-off", "dspark-full-attention", "dspark-no-confidence",
                                  "dspark-confidence-no-markov", "dspark-one-layer"])
def test_frozen_and_untrained_tensors_come_back_bit_identical(data, name, tmp_path):
    base = fixture(name)
    _train(base, data["rollouts"], tmp_path / "out", steps=2)
    _assert_drop_in(tmp_path / "out", base)
    before, after = _raw(base), _raw(tmp_path / "out")
    assert {n: f for n, (f, _) in before.items()} == {n: f for n, (f, _) in after.items()}   # same sharding
    frozen = [n for n in before if n in ("lm_head.weight", "d2t", "t2d")]
    assert bool(frozen) == (name == "dspark-pruned-vocab")
    for tensor in frozen:
        assert after[tensor] == before[tensor], tensor
    changed = [n for n in before if after[n] != before[n]]
    assert "fc.weight" in changed and not set(changed) & set(frozen)


@pytest.mark.slow
@pytest.mark.parametrize("name, head", [("dspark-gated-markov", "gated"), ("dspark-rnn-markov", "rnn")])
def test_gated_and_rnn_heads_train_with_verifys_serving_warning(data, name, head, tmp_path):
    result = _train(fixture(name), data["rollouts"], tmp_path / "out", steps=2)
    assert any(f"markov_head_type is '{head}'" in w and "vLLM 0.32.0 serves only the vanilla head" in w
               for w in result.warnings), result.warnings
    assert _log(tmp_path / "out")[0]["warnings"] == list(result.warnings)
    own = "markov_head.gate_proj.weight" if head == "gated" else "markov_head.joint_proj.weight"
    assert _raw(tmp_path / "out")[own] != _raw(fixture(name))[own]          # the head's own tensor trains
    assert not _train(fixture("dspark"), data["rollouts"], tmp_path / "vanilla", steps=1).warnings


@pytest.mark.slow
def test_the_cli_trains_a_speculators_base_and_prints_the_warning(data, tmp_path):
    result = run("finetune", "--base", fixture("dspark-gated-markov"), "--data", data["rollouts"], "--out",
                 tmp_path / "out", "--steps", "1", "--loss", '{"kl_div":1,"jsd":0.5}', "--quiet")
    assert result.exit_code == 0, result.output + result.stderr
    assert "warning: config.json:markov_head_type" in result.stderr or "warning: markov_head_type" in result.stderr
    entry = _log(tmp_path / "out")[-1]
    assert {"kl_div", "jsd", "confidence", "lr", "grad_norm", "tokens", "step_seconds"} <= set(entry)


@pytest.mark.slow
def test_a_resumed_run_reproduces_the_uninterrupted_one(data, tmp_path):
    whole = _train(fixture("dspark"), data["rollouts"], tmp_path / "whole", steps=4)
    _train(fixture("dspark"), data["rollouts"], tmp_path / "part", steps=4, save_every=2,
           state_dir=str(tmp_path / "states"))
    (tmp_path / "states" / "step-000004.pt").unlink()
    (tmp_path / "states" / "latest.json").write_text(json.dumps({"step": 2, "file": "step-000002.pt"}))
    again = _train(fixture("dspark"), data["rollouts"], tmp_path / "again", steps=4, resume=True,
                   state_dir=str(tmp_path / "states"))
    assert again.final_loss == pytest.approx(whole.final_loss, rel=1e-6)
    assert _raw(tmp_path / "again") == _raw(tmp_path / "whole")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dspark", "dspark-bonus-anchor"])
def test_the_plan_comes_before_step_1_and_the_result_counts_anchors_and_supervised_slots(data, name, tmp_path):
    """The packed row's plan counts what step 1's loss counts; without `sample_from_anchor` slot 0 is the anchor
    itself and never counts."""
    bar = RecordedProgress()
    config = TrainConfig(base=str(fixture(name)), out=str(tmp_path / "out"), data=str(data["rollouts"]),
                         target=TARGET, steps=3, batch_size=4, max_anchors=1, loss={"kl_div": 1.0})
    result = finetune(config, progress=bar)                 # --anchors is per sequence: 4 over the packed row
    assert bar.kinds == ["total", "plan", "step", "step", "step"]
    plan, log = bar.seen[1][1], _log(tmp_path / "out")
    assert result.plan is plan and plan.layout == "packed" and plan.steps == 3 and plan.sequences == 4
    assert (plan.step_anchors, plan.supervised_slots) == (log[0]["anchors"], log[0]["slots"]) and plan.anchors == 4
    assert result.anchors == sum(e["anchors"] for e in log) == 12
    assert result.supervised_slots == sum(e["slots"] for e in log)
    slots_per_block = plan.block_size - (name == "dspark-bonus-anchor")
    assert 0 < result.supervised_slots <= 12 * slots_per_block
    assert plan.memory_bytes > 0 and plan.dominant in plan.flops and plan.keys_per_row > plan.block_size


@pytest.mark.slow
def test_finetune_json_shows_a_speculators_plan_and_progress_on_stderr(data, tmp_path, monkeypatch):
    import dspark_hub.cli._output

    monkeypatch.setattr(dspark_hub.cli._output, "INTERVAL", 0.0)
    args = ["finetune", "--base", fixture("dspark"), "--data", data["rollouts"], "--steps", "2", "--batch-size", "4",
            "--anchors", "1", "--loss", '{"kl_div":1}', "--json"]
    shown = run(*args, "--out", tmp_path / "shown")
    assert shown.exit_code == 0, shown.output + shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["plan"]["layout"] == "packed" and doc["anchors"] == 8 and doc["supervised_slots"] > 0
    block = doc["plan"]["block_size"]
    for words in ("finetune plan, from step 1's batch: 4 sequences packed into one row of",
                  f"  4 anchors x block {block} = {4 * block} block rows",
                  "  the run: 2 steps x 4 anchors = ~8 anchors",
                  "finetune: 2 of 2 steps"):
        assert words in shown.stderr, (words, shown.stderr)
    quiet = run(*args, "--quiet", "--out", tmp_path / "quiet")
    assert quiet.exit_code == 0 and quiet.stderr == "" and json.loads(quiet.stdout)["plan"] == doc["plan"]


@pytest.mark.slow
def test_the_optimizer_takes_the_betas(data, tmp_path):
    from dspark_hub.train.finetuning.finetune_speculators import SpeculatorsFinetune

    def betas(**options):
        config = TrainConfig(base=str(fixture("dspark")), out=str(tmp_path / "out"), data=str(data["rollouts"]),
                             target=TARGET, steps=1, **options)
        return SpeculatorsFinetune(config).optimizer.param_groups[0]["betas"]

    assert betas() == (0.9, 0.95) and betas(betas=(0.8, 0.99)) == (0.8, 0.99)


# ---------------------------------------------------------------- refusals, before anything is written

def _finetune(base, data_path, out, *extra):
    return run("finetune", "--base", base, "--data", data_path, "--out", out, "--steps", "1", "--teacher", TARGET,
               *extra)


@pytest.mark.parametrize("ids, words", [
    ([2, 4, 6], ["recorded target_layer_ids [0, 2, 4], the draft reads [1, 3, 5]"]),
    ([1, 3, 9], ["aux ids [9] are outside [0, 6]"]),
    ([0, 3, 5], ["id 0 (the embedding output)"]),
])
@pytest.mark.slow
def test_taps_that_do_not_fit_are_refused_naming_them(data, tmp_path, ids, words):
    base = edit_config(copy_fixture(tmp_path, "dspark", "base"), set_key("aux_hidden_state_layer_ids", ids))
    assert_one_line_error(_finetune(base, data["rollouts"], tmp_path / "out"), *words)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_vllm_files_missing_a_tap_are_refused_naming_the_file(data, tmp_path):
    base = edit_config(copy_fixture(tmp_path, "dspark", "base"), set_key("aux_hidden_state_layer_ids", [2, 3, 5]))
    result = _finetune(base, data["vllm"], tmp_path / "out", "--data-layer-ids", "1,3,5,6")
    line = assert_one_line_error(result, "req-0.safetensors", "the draft taps [1, 2, 4], [1] missing")
    assert line.startswith("Error: ") and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_hidden_size_mismatch_is_refused_naming_it(data, tmp_path):
    (tmp_path / "narrow").mkdir()
    write_hidden_state_file(tmp_path / "narrow" / "a.safetensors", torch.zeros(9, 4, 32), torch.arange(9))
    assert_one_line_error(_finetune(fixture("dspark"), tmp_path / "narrow", tmp_path / "out"),
                          "a.safetensors: hidden size 32")
    narrow_target = edit_config(copy_fixture(tmp_path, "verifier-qwen3-tiny", "target"), set_key("hidden_size", 32))
    result = run("finetune", "--base", fixture("dspark"), "--data", data["vllm"], "--out", tmp_path / "out",
                 "--steps", "1", "--teacher", narrow_target)
    assert_one_line_error(result, "hidden_size is 32", "transformer_layer_config.hidden_size is 64")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("change, words", [
    (reshape("fc.weight", (64, 128)), "fc.weight is [64, 128], its config implies [64, 192]"),
    (drop("hidden_norm.weight"), "no tensor hidden_norm.weight"),
    (add("extra.weight", (2, 2)), "extra.weight is not in the roster"),
])
def test_a_base_whose_tensors_do_not_fit_its_config_is_refused_naming_the_tensor(data, tmp_path, change, words):
    base = edit_tensors(copy_fixture(tmp_path, "dspark", "base"), change)
    assert_one_line_error(_finetune(base, data["rollouts"], tmp_path / "out"), words)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eagle3", "dflash", "mtp"])
def test_a_speculators_draft_of_another_family_is_refused(data, tmp_path, name):
    assert_one_line_error(_finetune(fixture(name), data["rollouts"], tmp_path / "out"), "finetune trains")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_base_without_a_mask_token_is_refused(data, tmp_path):
    base = edit_config(copy_fixture(tmp_path, "dspark", "base"), set_key("mask_token_id", ...))
    assert_one_line_error(_finetune(base, data["rollouts"], tmp_path / "out"), "no mask_token_id")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, words", [
    (["--block-size", "6"], ["--block-size", "trains blocks of 4"]),
    (["--loss", '{"mse":1}'], ["--loss", "'mse'"]),
    (["--on-policy", "--prompts", "p.jsonl"], ["--on-policy", "not available for a speculators DSpark"]),
    (["--eval-data", "x", "--eval-every", "1"], ["--eval-data", "not available", "measure the output with eval"]),
    (["--fsdp"], ["--fsdp", "not available"]),
    (["--device", "cuda"], ["--device", "trains on the CPU here"]),
])
@pytest.mark.slow
def test_options_a_speculators_run_does_not_take_are_refused(data, tmp_path, extra, words):
    assert_one_line_error(_finetune(fixture("dspark"), data["rollouts"], tmp_path / "out", *extra), *words)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_base_itself_is_never_the_output_even_with_force(data, tmp_path):
    base = copy_fixture(tmp_path, "dspark", "base")
    before = {p.name: p.read_bytes() for p in base.iterdir()}
    for out in (base, base / "trained"):
        assert_one_line_error(_finetune(base, data["rollouts"], out, "--force"), "--out", "the input --base")
    assert {p.name: p.read_bytes() for p in base.iterdir()} == before


@pytest.mark.slow
def test_an_existing_output_is_kept_without_force(data, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep").write_text("x")
    assert_one_line_error(_finetune(fixture("dspark"), data["rollouts"], tmp_path / "out"), "out")
    assert (tmp_path / "out" / "keep").read_text() == "x"
    shutil.rmtree(tmp_path / "out")


# ---------------------------------------------------------------- the pieces

def test_every_registered_format_has_a_trainer():
    from dspark_hub.format.registry import FORMATS
    from dspark_hub.train.finetuning.finetuners import FINETUNERS

    assert all(f.trainable != (f.name in FINETUNERS) for f in FORMATS.values())


def test_a_final_normed_row_skips_the_targets_norm_and_gives_the_pre_norm_rows_loss():
    from dspark_hub.modeling.speculators_dspark import read_tensors, rms_norm
    from dspark_hub.train.finetuning.objective_speculators import (
        Objective,
        PackedRow,
        SpeculatorsDSparkTrainer,
        library_anchors,
    )

    config = json.loads((fixture("dspark") / "config.json").read_text())
    target = read_tensors(VERIFIER)
    norm = torch.rand(64, generator=torch.Generator().manual_seed(2)) + 0.5     # not ones: norming twice shows
    trainer = SpeculatorsDSparkTrainer(config, {k: v.float() if v.is_floating_point() else v
                                                for k, v in read_tensors(fixture("dspark")).items()},
                                       target["model.embed_tokens.weight"].float(), target["lm_head.weight"].float(),
                                       norm)
    generator = torch.Generator().manual_seed(0)
    n = 30
    pre = torch.randn(n, 64, generator=generator) * 3
    row = dict(taps=torch.randn(n, 192, generator=generator),
               input_ids=torch.randint(0, 250, (n,), generator=generator), loss_mask=torch.ones(n),
               document_ids=torch.zeros(n, dtype=torch.long), positions=torch.arange(n))
    anchors = library_anchors(row["loss_mask"], 8, 4, torch.Generator().manual_seed(1))
    objective = Objective(loss={"kl_div": 1.0})
    before = trainer.loss(PackedRow(**row, last_hidden=pre), anchors, objective).total
    normed = trainer.loss(PackedRow(**row, last_hidden=rms_norm(pre, norm, 1e-6), final_normed=True), anchors,
                          objective).total
    twice = trainer.loss(PackedRow(**row, last_hidden=rms_norm(pre, norm, 1e-6)), anchors, objective).total
    torch.testing.assert_close(normed, before, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(twice, before, rtol=1e-3)       # normed states normed again are other targets


@pytest.mark.slow
def test_eval_measures_the_output(data, tmp_path):
    _train(fixture("dspark"), data["rollouts"], tmp_path / "out", steps=1)
    result = run("eval", "--draft", tmp_path / "out", "--teacher", TARGET, "--data", data["rollouts"], "--json")
    assert result.exit_code == 0, result.output + result.stderr
    report = json.loads(result.stdout)
    assert report["acceptance_length"] >= 1.0 and report["k"] == 4 and report["drafts"] > 0


@pytest.mark.slow
def test_the_training_args_record_the_block_size_b_trains_with(data, tmp_path):
    _train(fixture("dspark"), data["rollouts"], tmp_path / "out", steps=1)
    args = json.loads((tmp_path / "out" / "training_args.json").read_text())
    assert args["block_size"] == 4 and args["loss"] == {"kl_div": 1.0} and args["steps"] == 1
