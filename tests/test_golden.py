"""Golden vectors: written on a tiny checkpoint, `golden check` passes; a one-ulp weight change,
the half-split rotation or a dropped mscale make it fail."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import save_file

from dspark_hub.cli.main import cli
from dspark_hub.format import contract
from dspark_hub.modeling import modeling_k3_dspark as mk
from dspark_hub.verify.golden import check_golden, write_golden

from .cli_errors import assert_one_line_error
from .factories import file_digest, tensors_for, write_checkpoint

TINY = contract.TINY_CONFIG


@pytest.fixture(scope="module")
def fixture(tmp_path_factory):
    folder = tmp_path_factory.mktemp("golden")
    ckpt = write_checkpoint(folder / "ckpt")
    result = CliRunner().invoke(cli, ["golden", str(ckpt), "-o", str(folder / "golden.safetensors"), "--json"])
    assert result.exit_code == 0, result.output
    return ckpt, folder / "golden.safetensors"


def numeric_failures(result):
    return {c["tensor"] for c in result.comparisons if not c["ok"]}


def test_fixture_binds_config_and_weights_and_covers_long_positions(fixture):
    ckpt, golden = fixture
    with safe_open(str(golden), framework="pt") as handle:
        meta = handle.metadata()
        keys = set(handle.keys())
        positions = handle.get_tensor("long.position_ids")
    assert meta["schema"] == "dspark-hub/golden-fixture/1"
    assert meta["config_sha256"] == file_digest(ckpt / "config.json")
    assert json.loads(meta["weights_sha256"]) == {"model.safetensors": file_digest(ckpt / "model.safetensors")}
    assert json.loads(meta["lm_head"])["kind"] == "seeded-standin"
    assert int(positions.min()) >= TINY["rope_parameters"]["original_max_position_embeddings"]
    for case in ("short", "long"):
        assert {f"{case}.{n}" for n in ("context_states", "anchor_ids", "drafted_tokens", "last_hidden_state",
                                         "markov_bias", "confidence", "greedy_tokens", "greedy_logits")} <= keys


def test_check_passes_on_the_same_checkpoint(fixture):
    ckpt, golden = fixture
    result = CliRunner().invoke(cli, ["golden", "check", str(ckpt), str(golden), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] and doc["problems"] == [] and len(doc["comparisons"]) == 10


def test_one_bf16_ulp_in_one_weight_fails(fixture, tmp_path):
    _, golden = fixture
    tensors = tensors_for(TINY)
    bits = tensors["layers.0.self_attn.o_proj.weight"].view(torch.int16)
    bits.view(-1)[0] += 1                                   # the next bf16 value of one element
    changed = write_checkpoint(tmp_path / "ulp", tensors=tensors)
    result = check_golden(changed, golden)
    assert not result.ok
    assert any("weights_sha256" in p for p in result.problems)
    assert "short.last_hidden_state" in numeric_failures(result)      # the numbers themselves differ too


def half_split_rope(x, cos, sin):
    """NeoX rotation: pairs (i, i + d/2) instead of (2i, 2i + 1)."""
    first, second = x.float().chunk(2, dim=-1)
    cos, sin = cos.float(), sin.float()
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1).to(x.dtype)


def test_swapped_rope_rotation_fails(fixture, monkeypatch):
    ckpt, golden = fixture
    monkeypatch.setattr(mk, "apply_interleaved_rope", half_split_rope)
    result = check_golden(ckpt, golden)
    assert not result.ok and result.problems == []
    assert {"short.last_hidden_state", "long.last_hidden_state"} <= numeric_failures(result)


def test_dropped_mscale_fails(fixture, monkeypatch):
    ckpt, golden = fixture
    qk = TINY["qk_nope_head_dim"] + TINY["qk_rope_head_dim"]
    monkeypatch.setattr(mk, "softmax_scale", lambda config: qk ** -0.5)
    result = check_golden(ckpt, golden)
    assert not result.ok and result.problems == []
    assert "long.last_hidden_state" in numeric_failures(result)


def test_lm_head_file_is_recorded_and_required(tmp_path):
    ckpt = write_checkpoint(tmp_path / "c")
    head = tmp_path / "head.safetensors"
    save_file({"lm_head.weight": torch.randn(TINY["draft_vocab_size"], TINY["hidden_size"])}, str(head))
    golden = tmp_path / "g.safetensors"
    write_golden(ckpt, golden, lm_head=head)
    assert check_golden(ckpt, golden, lm_head=head).ok
    missing = CliRunner().invoke(cli, ["golden", "check", str(ckpt), str(golden)])
    assert missing.exit_code == 2 and "--lm-head" in missing.output
    refused = CliRunner().invoke(cli, ["golden", str(ckpt), "-o", str(golden)])
    assert refused.exit_code == 2 and "already exists" in refused.output


#: lm_head files of the wrong shape for the tiny draft ([draft_vocab_size 512, hidden_size 64]).
WRONG_HEADS = {"fewer rows": (300, 64), "transposed": (64, 512), "one axis": (512,), "three axes": (512, 64, 1)}


@pytest.mark.parametrize("shape", WRONG_HEADS.values(), ids=WRONG_HEADS.keys())
def test_an_lm_head_of_the_wrong_shape_is_a_usage_error_naming_the_file(tmp_path, shape):
    ckpt = write_checkpoint(tmp_path / "c")
    good, bad = tmp_path / "good.safetensors", tmp_path / "bad.safetensors"
    save_file({"lm_head.weight": torch.randn(TINY["draft_vocab_size"], TINY["hidden_size"])}, str(good))
    save_file({"lm_head.weight": torch.randn(*shape)}, str(bad))
    golden = tmp_path / "g.safetensors"
    written = CliRunner().invoke(cli, ["golden", str(ckpt), "-o", str(golden), "--lm-head", str(good)])
    assert written.exit_code == 0, written.output
    assert CliRunner().invoke(cli, ["golden", "check", str(ckpt), str(golden), "--lm-head", str(good)]).exit_code == 0
    for args in (["golden", str(ckpt), "-o", str(tmp_path / "g2.safetensors")],
                 ["golden", "check", str(ckpt), str(golden)]):
        result = CliRunner().invoke(cli, [*args, "--lm-head", str(bad)])
        assert_one_line_error(result, str(bad), f"lm_head.weight is {list(shape)}", "[512, 64]")
    assert not (tmp_path / "g2.safetensors").exists()


def test_fixture_ships_under_golden_and_the_card_lists_it(tmp_path, fixture):
    import shutil

    import yaml

    from dspark_hub.cards.render import render_card
    from dspark_hub.verify.checks import verify

    ckpt, golden = fixture
    folder = tmp_path / "ckpt"
    shutil.copytree(ckpt, folder)
    beside = CliRunner().invoke(cli, ["golden", str(folder), "-o", str(folder / "golden.safetensors")])
    assert beside.exit_code == 2 and "golden/golden.safetensors" in beside.stderr
    assert not (folder / "golden.safetensors").exists()

    (folder / "golden").mkdir()
    shutil.copy(golden, folder / "golden" / "golden.safetensors")
    assert verify(folder).ok   # the passing twin: a fixture under golden/ is not a weight file
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": {"license": "apache-2.0"},
                                    "architecture": {"block_size": 7}}))
    card = render_card(meta, folder)
    assert "`golden/golden.safetensors` (block size 7; cases: short from position 0, long from position 512)" in card
    assert "dspark-hub golden check . golden/golden.safetensors" in card

    shutil.copy(golden, folder / "golden.safetensors")   # the failing fixture: beside the weights
    report = verify(folder)
    assert [(f.code, f.where) for f in report.errors] == [("GOLDEN_IN_WEIGHTS_FOLDER", "golden.safetensors")]
    assert report.summary.tensors == 32 and report.summary.layout == "single"


def check_cli(ckpt, golden):
    return CliRunner().invoke(cli, ["golden", "check", str(ckpt), str(golden), "--json"])


def test_another_shape_is_a_problem_naming_the_keys(fixture, tmp_path):
    from .factories import sparse_reference, tiny_config

    _, golden = fixture
    config = tiny_config(markov_rank=TINY["markov_rank"] * 2)
    other = write_checkpoint(tmp_path / "rank", config=config)
    result = check_cli(other, golden)
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert any("markov_rank" in p for p in doc["problems"]) and doc["comparisons"] == []
    reference = check_cli(sparse_reference(tmp_path / "ref"), golden)
    assert reference.exit_code == 1, reference.output
    assert any("hidden_size" in p for p in json.loads(reference.stdout)["problems"])


def test_a_file_that_is_not_a_fixture_is_one_line(fixture):
    ckpt, _ = fixture
    assert_one_line_error(check_cli(ckpt, ckpt / "config.json"), "config.json", "not a safetensors file")


@pytest.mark.parametrize("config, words", [
    ("[1, 2]", ("config.json", "JSON array", "verify")),
    (dict(TINY, num_hidden_layers="2"), ("config.json:num_hidden_layers", "verify")),
])
def test_unsound_checkpoint_is_refused_with_verifys_first_error(fixture, tmp_path, config, words):
    _, golden = fixture
    broken = write_checkpoint(tmp_path / "broken", config=config, tensors=tensors_for(TINY))
    assert_one_line_error(check_cli(broken, golden), *words)
    written = CliRunner().invoke(cli, ["golden", str(broken), "-o", str(tmp_path / "g.safetensors")])
    assert_one_line_error(written, *words)
    assert not (tmp_path / "g.safetensors").exists()


def test_fixture_gets_new_file_permissions_and_no_temp_leftover(tmp_path):
    import os

    ckpt = write_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out" / "g.safetensors"
    write_golden(ckpt, out)
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in out.parent.iterdir()] == ["g.safetensors"]


@pytest.mark.slow        # a fresh process that imports torch: ~15 s
def test_json_mode_leaves_stderr_empty(tmp_path):
    # A fresh process: transformers' progress-bar switch is global, so an in-process test could pass by accident.
    import os
    import subprocess
    import sys

    ckpt = write_checkpoint(tmp_path / "c")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}   # conftest sets it
    out = subprocess.run([sys.executable, "-m", "dspark_hub", "golden", str(ckpt), "-o",
                          str(ckpt / "golden" / "g.safetensors"), "--json"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and json.loads(out.stdout)["schema"] == "dspark-hub/golden-write/1"
