"""`dspark-hub init --target T`: a draft of either format sized for any transformers causal LM.

The targets are the offline tiny teachers of `init-teacher` (a BF16 Llama with its own tokenizer); the
real SmolLM2 target is in tests/test_real_world.py and at the end here (marked `real`).
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format import contract
from dspark_hub.format.registry import K3, SPECULATORS
from dspark_hub.ops.target_draft import MLA_WIDTH_KEYS, read_target, tap_layers
from dspark_hub.verify.checks import verify

from .cli_errors import assert_one_line_error
from .test_real_world import WORLD, needs_world


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    folder = tmp_path_factory.mktemp("teacher") / "tiny-teacher"
    result = run("init-teacher", folder, "-q")
    assert result.exit_code == 0, result.output
    return folder


def _tensors(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _teacher_tensor(teacher, name):
    tensors = _tensors(teacher)
    return tensors.get(name, tensors.get(f"model.{name}"))


# ---------------------------------------------------------------- taps

@pytest.mark.parametrize("fmt, taps", [(K3, [2, 23, 47, 71, 89]), (SPECULATORS, [23, 47, 71, 87, 91])])
def test_the_reference_target_gets_the_recipe_taps_back(fmt, taps):
    assert tap_layers(93, fmt) == taps


@pytest.mark.parametrize("layers, fmt, taps", [
    (30, K3, [1, 7, 14, 22, 27]),      # SmolLM2-135M
    (30, SPECULATORS, [7, 14, 22, 27, 28]),
    (6, K3, [0, 1, 2, 3, 4]),          # the tiny teacher
    (4, K3, [0, 1, 2]),                # coinciding taps merge
    (1, K3, [0]),
])
def test_taps_spread_over_the_target_as_the_recipes_place_them(layers, fmt, taps):
    assert tap_layers(layers, fmt) == taps


@pytest.mark.parametrize("fmt", [K3, SPECULATORS])
def test_taps_are_ascending_distinct_and_never_the_final_layer(fmt):
    for layers in range(3, 200):
        taps = tap_layers(layers, fmt)
        assert taps == sorted(set(taps)) and taps[0] >= 0 and taps[-1] < layers - 1, (layers, taps)


# ---------------------------------------------------------------- both formats on the tiny teacher

def test_k3_draft_for_the_tiny_teacher_pairs_and_copies_the_embedding(teacher, tmp_path):
    import torch

    result = run("init", tmp_path / "d", "--target", teacher, "--layers", "1", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    facts = read_target(teacher)
    assert (config["hidden_size"], config["vocab_size"], config["target_num_hidden_layers"]) == \
        (facts.hidden_size, facts.vocab_size, facts.num_layers)
    assert config["target_layer_ids"] == doc["target_layer_ids"] == tap_layers(facts.num_layers, K3)
    assert config["num_hidden_layers"] == 1
    embed = _tensors(tmp_path / "d")["embed_tokens.weight"]
    assert torch.equal(embed.view(torch.int16), _teacher_tensor(teacher, "embed_tokens.weight").view(torch.int16))
    report = verify(tmp_path / "d", target=teacher)
    assert report.ok, [f.to_dict() for f in report.findings]
    assert report.sections["pairing"]["embedding"]["verdict"] == "bit-identical"
    provenance = json.loads((tmp_path / "d" / "dspark_init.json").read_text())
    assert provenance["mask_token"]["id"] == config["mask_token_id"] == 509
    assert "mask_token" in provenance["mask_token"]["reason"]


def test_speculators_draft_for_the_tiny_teacher_pairs_with_aux_ids_one_past_the_taps(teacher, tmp_path):
    result = run("init", tmp_path / "d", "--target", teacher, "--format", "speculators", "--taps", "1,3",
                 "--block-size", "5", "--json")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["aux_hidden_state_layer_ids"] == [2, 4]
    assert config["block_size"] == 5 == config["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    assert config["draft_vocab_size"] == config["transformer_layer_config"]["vocab_size"] == 512
    assert "lm_head.weight" not in _tensors(tmp_path / "d")
    report = verify(tmp_path / "d", target=teacher)
    assert report.ok, [f.to_dict() for f in report.findings]


def _write_token_data(path, rows):
    path.write_text("".join(json.dumps({"input_ids": ids}) + "\n" for ids in rows))
    return path


def test_pruned_vocabulary_keeps_the_most_frequent_ids_and_the_target_rows(teacher, tmp_path):
    import torch

    data = _write_token_data(tmp_path / "data.jsonl", [[5, 5, 5, 7, 7, 300], [7, 9, 9, 9, 9, 300, 5]])
    result = run("init", tmp_path / "d", "--target", teacher, "--format", "speculators", "--draft-vocab", "4",
                 "--vocab-from", data, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    tensors = _tensors(tmp_path / "d")
    kept = (torch.arange(4) + tensors["d2t"]).tolist()
    mask = doc["mask_token"]["id"]
    # the mask id always has a row; then by frequency: 5 and 9 (4 each), 7 (3); 300 (2) does not fit
    assert kept == sorted([5, 7, 9, mask]) and tensors["t2d"].nonzero().flatten().tolist() == kept
    assert mask not in (5, 7, 9, 300)
    rows = _teacher_tensor(teacher, "lm_head.weight")[kept]
    assert torch.equal(tensors["lm_head.weight"].view(torch.int16), rows.view(torch.int16))
    assert doc["vocab_coverage"] == pytest.approx(11 / 13)
    report = verify(tmp_path / "d", target=teacher)
    assert report.ok, [f.to_dict() for f in report.findings]


# ---------------------------------------------------------------- the mask token

def _without_mask_token(teacher, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(teacher, target)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["mask_token"]
    config_path.write_text(json.dumps(config))
    return target


def test_without_a_mask_token_the_highest_reserved_special_token_is_chosen(teacher, tmp_path):
    target = _without_mask_token(teacher, tmp_path)
    result = run("init", tmp_path / "d", "--target", target, "--json")
    assert result.exit_code == 0, result.output
    chosen = json.loads(result.stdout)["mask_token"]
    assert (chosen["id"], chosen["content"]) == (510, "<|reserved_510|>")   # 511 is the pad id
    assert "bos/eos/pad/unk" in chosen["reason"]
    assert verify(tmp_path / "d", target=target).ok


def test_the_mask_token_avoids_ids_the_data_uses(teacher, tmp_path):
    target = _without_mask_token(teacher, tmp_path)
    data = _write_token_data(tmp_path / "data.jsonl", [[510, 508, 40]])
    result = run("init", tmp_path / "d", "--target", target, "--vocab-from", data, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["mask_token"]["id"] == 509


def test_a_tokenizer_without_a_spare_special_token_is_refused(teacher, tmp_path):
    target = _without_mask_token(teacher, tmp_path)
    doc = json.loads((target / "tokenizer.json").read_text())
    doc["added_tokens"] = [t for t in doc["added_tokens"] if t["id"] in (0, 1, 2, 511)]
    (target / "tokenizer.json").write_text(json.dumps(doc))
    result = run("init", tmp_path / "d", "--target", target)
    assert_one_line_error(result, "--target", "no special token")
    assert not (tmp_path / "d").exists()


# ---------------------------------------------------------------- bad input

def _no_config(teacher, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    return target


def _config_without_hidden_size(teacher, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(teacher, target)
    config = json.loads((target / "config.json").read_text())
    del config["hidden_size"]
    (target / "config.json").write_text(json.dumps(config))
    return target


def _config_not_json(teacher, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(teacher, target)
    (target / "config.json").write_text("{not json")
    return target


@pytest.mark.parametrize("make, words", [
    (_no_config, ["no config.json", "target model's folder"]),
    (_config_without_hidden_size, ["hidden_size", "not a positive integer"]),
    (_config_not_json, ["config.json", "not readable JSON"]),
])
def test_a_target_that_is_no_causal_lm_is_refused_in_one_line(teacher, tmp_path, make, words):
    result = run("init", tmp_path / "d", "--target", make(teacher, tmp_path))
    assert_one_line_error(result, *words)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("args, words", [
    (["--taps", "2,60"], ["--taps", "[2, 60]", "[0, 6)"]),
    (["--format", "speculators", "--draft-vocab", "64"], ["--vocab-from", "token frequencies"]),
    (["--draft-vocab", "64", "--vocab-from", "DATA"], ["--draft-vocab", "speculators-format"]),
    (["--format", "speculators", "--draft-vocab", "600", "--vocab-from", "DATA"], ["--draft-vocab", "600", "512"]),
])
def test_bad_options_are_refused_in_one_line(teacher, tmp_path, args, words):
    data = _write_token_data(tmp_path / "data.jsonl", [[5, 6]])
    result = run("init", tmp_path / "d", "--target", teacher, *[data if a == "DATA" else a for a in args])
    assert_one_line_error(result, *words)
    assert not (tmp_path / "d").exists()


def test_taps_that_are_not_numbers_are_a_usage_error(teacher, tmp_path):
    result = run("init", tmp_path / "d", "--target", teacher, "--taps", "one,two")
    assert_one_line_error(result, "--taps", "one,two", one_line=False)


def test_an_existing_output_is_kept_without_force(teacher, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("mine")
    result = run("init", tmp_path / "d", "--target", teacher)
    assert result.exit_code == 2
    assert (tmp_path / "d" / "keep").read_text() == "mine"
    assert run("init", tmp_path / "d", "--target", teacher, "--force").exit_code == 0
    assert not (tmp_path / "d" / "keep").exists()


# ---------------------------------------------------------------- options that a draft sized for T would ignore

@pytest.mark.parametrize("fmt", ["k3_dspark", "speculators"])
@pytest.mark.parametrize("args, words", [
    (["--profile", "tiny"], ["--profile", "--target", "--mla-widths-from"]),
    (["--profile", "kimi-k3"], ["--profile", "--target", "drop --profile"]),
    (["--embed-from", "TEACHER"], ["--embed-from", "--target", "copies T's own embedding"]),
    (["--embed-from", "TEACHER", "--profile", "tiny"], ["--target", "drop --"]),
])
def test_profile_options_with_a_target_are_refused_in_one_line(teacher, tmp_path, fmt, args, words):
    result = run("init", tmp_path / "d", "--target", teacher, "--format", fmt,
                 *[teacher if a == "TEACHER" else a for a in args])
    assert_one_line_error(result, *words)
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("fmt", ["k3_dspark", "speculators"])
def test_the_same_target_draft_without_profile_options_is_written(teacher, tmp_path, fmt):
    result = run("init", tmp_path / "d", "--target", teacher, "--format", fmt, "--seed", "1", "--init", "random")
    assert result.exit_code == 0, result.output
    assert verify(tmp_path / "d", target=teacher).ok


# ---------------------------------------------------------------- --init with a target

def _matrices(folder):
    return {name: t for name, t in _tensors(folder).items()
            if t.dim() == 2 and "embed" not in name and "lm_head" not in name}


@pytest.mark.parametrize("fmt", ["k3_dspark", "speculators"])
def test_init_zeros_is_honoured_for_a_target_and_random_is_not_zero(teacher, tmp_path, fmt):
    import torch

    for kind in ("zeros", "random"):
        result = run("init", tmp_path / kind, "--target", teacher, "--format", fmt, "--init", kind)
        assert result.exit_code == 0, result.output
        assert verify(tmp_path / kind, target=teacher).ok
    zeros, random = _matrices(tmp_path / "zeros"), _matrices(tmp_path / "random")
    assert zeros and zeros.keys() == random.keys()
    assert all(not t.any() for t in zeros.values())
    assert all(t.float().std() > 0.01 for t in random.values())
    if fmt == "k3_dspark":     # the embedding is T's whichever way the matrices start
        embeds = [_tensors(tmp_path / k)["embed_tokens.weight"].view(torch.int16) for k in ("zeros", "random")]
        assert torch.equal(*embeds)
        assert torch.equal(embeds[0], _teacher_tensor(teacher, "embed_tokens.weight").view(torch.int16))


# ---------------------------------------------------------------- MLA widths of a profile

@pytest.mark.parametrize("profile", sorted(contract.PROFILES))
def test_mla_widths_from_a_profile_give_its_widths_and_pair_with_the_target(teacher, tmp_path, profile):
    result = run("init", tmp_path / "d", "--target", teacher, "--mla-widths-from", profile, "--json")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert {k: config[k] for k in MLA_WIDTH_KEYS} == {k: contract.PROFILES[profile][k] for k in MLA_WIDTH_KEYS}
    facts = read_target(teacher)
    assert (config["hidden_size"], config["num_attention_heads"]) == (facts.hidden_size, facts.heads)
    assert json.loads(result.stdout)["mla_widths_from"] == profile
    assert json.loads((tmp_path / "d" / "dspark_init.json").read_text())["mla_widths_from"] == profile
    report = verify(tmp_path / "d", target=teacher)
    assert report.ok, [f.to_dict() for f in report.findings]


def test_without_mla_widths_from_the_widths_scale_with_the_target_head_size(teacher, tmp_path):
    assert run("init", tmp_path / "d", "--target", teacher).exit_code == 0
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    facts = read_target(teacher)
    assert [config[k] for k in MLA_WIDTH_KEYS] == [facts.hidden_size // 4, facts.head_dim, facts.head_dim // 2,
                                                   facts.head_dim]
    assert config["kv_lora_rank"] != contract.PROFILES["kimi-k3"]["kv_lora_rank"]
    assert json.loads((tmp_path / "d" / "dspark_init.json").read_text())["mla_widths_from"] is None


@pytest.mark.parametrize("args, words", [
    (["--format", "speculators", "--mla-widths-from", "kimi-k3"], ["--mla-widths-from", "k3_dspark setting"]),
    (["--mla-widths-from", "kimi-k4"], ["--mla-widths-from", "kimi-k4"]),
    (["--mla-widths-from", "TINY"], ["--mla-widths-from", "TINY"]),
])
def test_bad_mla_widths_options_are_refused(teacher, tmp_path, args, words):
    result = run("init", tmp_path / "d", "--target", teacher, *args)
    assert_one_line_error(result, *words, one_line="speculators" in args)
    assert not (tmp_path / "d").exists()


@pytest.mark.real
@needs_world
def test_smollm2_draft_with_kimi_k3_mla_widths_pairs(tmp_path):
    target = WORLD / "bf16"
    result = run("init", tmp_path / "d", "--target", target, "--mla-widths-from", "kimi-k3", "--json")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert [config[k] for k in MLA_WIDTH_KEYS] == [512, 128, 64, 128]
    assert (config["hidden_size"], config["num_attention_heads"], config["vocab_size"]) == (576, 9, 49152)
    report = verify(tmp_path / "d", target=target)
    assert report.ok, [f.to_dict() for f in report.findings]
    assert report.sections["pairing"]["embedding"]["verdict"] == "bit-identical"
