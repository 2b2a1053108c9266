"""convert refuses what it cannot make a k3_dspark draft of, naming the family, before anything is written."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.errors import ConversionRefusedError
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
from dspark_hub.format.registry import K3, SPECULATORS
from dspark_hub.ops.convert import convert
from dspark_hub.ops.crosswalk import crosswalk, grouped

from .factories import write_checkpoint
from .spec_fixtures import FAMILY_OF, copy_fixture, fixture

GQA_ATTENTION = ["layers.{0..1}.self_attn.k_norm.weight", "layers.{0..1}.self_attn.k_proj.weight",
                 "layers.{0..1}.self_attn.o_proj.weight", "layers.{0..1}.self_attn.q_norm.weight",
                 "layers.{0..1}.self_attn.q_proj.weight", "layers.{0..1}.self_attn.v_proj.weight"]


def refused(src, tmp_path, **kwargs):
    dst = tmp_path / "dst"
    with pytest.raises(ConversionRefusedError) as e:
        convert(src, dst, **kwargs)
    assert not dst.exists()
    return e.value


@pytest.mark.parametrize("name", ["eagle3", "peagle", "mtp", "xpress", "dflash", "dflash2"])
def test_another_family_is_refused_naming_it_and_what_serves_it(tmp_path, name):
    error = refused(fixture(name), tmp_path)
    assert error.family == f"speculators_{FAMILY_OF[name]}"
    assert "is a speculators-format" in error.message and "convert only rewrites k3_dspark exports" in error.message
    assert error.hint.startswith("serve it as it is (")


def test_a_gqa_body_under_a_hand_written_k3_config_is_refused_before_anything_is_written(tmp_path):
    from safetensors.torch import load_file

    body = load_file(str(fixture("dspark") / "model.safetensors"))
    src = write_checkpoint(tmp_path / "liar", config=contract.TINY_CONFIG, tensors=body)
    error = refused(src, tmp_path)
    assert error.family == "gqa_dspark" and "although config.json says k3_dspark" in error.message
    result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "dst2")])
    assert result.exit_code == 2 and not (tmp_path / "dst2").exists()
    assert "GQA DSpark" in result.stderr


def test_a_gqa_body_without_markov_head_under_k3_names_is_refused_too(tmp_path):
    from safetensors.torch import load_file

    renamed = {"fc.weight": "context_proj.weight", "hidden_norm.weight": "context_norm.weight",
               "norm.weight": "final_norm.weight"}
    body = {renamed.get(k, k): v for k, v in load_file(str(fixture("dspark-markov-off") / "model.safetensors")).items()}
    src = write_checkpoint(tmp_path / "liar", config=contract.TINY_CONFIG, tensors=body)
    error = refused(src, tmp_path)
    assert error.family == "dflash" and "although config.json says k3_dspark" in error.message


def test_speculators_to_k3_is_refused_naming_the_attention_without_counterpart(tmp_path):
    error = refused(fixture("dspark"), tmp_path)
    assert error.family == "speculators_dspark" and error.target == "k3_dspark"
    detail = error.detail
    assert detail["lossless"] is False and detail["no_counterpart"] == GQA_ATTENTION
    assert "embed_tokens.weight" in detail["no_source"]           # speculators never saves it
    assert detail["mapped"]["fc.weight"] == "context_proj.weight"
    assert detail["mapped"]["layers.1.mlp.up_proj.weight"] == "layers.1.mlp.up_proj.weight"
    assert detail["taps"] == {"target_layer_ids": [0, 2, 4], "from": {"aux_hidden_state_layer_ids": [1, 3, 5]}}
    assert "the attention does not" in error.message
    same = refused(fixture("dspark"), tmp_path, from_="speculators", to="k3_dspark")
    assert same.detail == detail


def test_pruned_vocabulary_tensors_have_no_k3_counterpart(tmp_path):
    error = refused(fixture("dspark-pruned-vocab"), tmp_path)
    assert {"d2t", "t2d", "lm_head.weight"} <= set(error.detail["no_counterpart"])


def test_k3_to_speculators_is_refused_the_other_way(tmp_path):
    src = write_checkpoint(tmp_path / "k3")
    error = refused(src, tmp_path, to="speculators")
    assert error.target == "speculators_dspark"
    assert "layers.{0..1}.self_attn.q_a_proj.weight" in error.detail["no_counterpart"]
    assert "embed_tokens.weight" not in error.detail["no_counterpart"]   # the target's embedding: no loss
    expected_ids = [i + 1 for i in contract.TINY_CONFIG["target_layer_ids"]]
    assert error.detail["taps"]["aux_hidden_state_layer_ids"] == expected_ids


def test_from_must_match_what_src_is(tmp_path):
    error = refused(write_checkpoint(tmp_path / "k3"), tmp_path, from_="speculators")
    assert "not a speculators DSpark checkpoint" in error.message
    again = refused(fixture("dspark"), tmp_path, to="speculators")
    assert "already" in again.message and "nothing to convert" in again.message


def test_the_crosswalk_is_never_lossless_for_a_draft_with_layers():
    view = open_checkpoint(LocalSource(fixture("dspark-one-layer")))
    walk = crosswalk(list(view.tensors), view.config, SPECULATORS, K3)
    assert not walk.lossless and len(walk.mapped) == 5 + 3 + 4   # layer norms + MLP, context path + norm, heads
    assert grouped(["layers.0.a", "layers.1.a", "layers.3.a", "x"]) == ["x", "layers.{0,1,3}.a"]


def test_cli_choices_come_from_the_registry(tmp_path):
    option = next(p for p in cli.commands["convert"].params if p.name == "to")
    assert list(option.type.choices) == ["k3_dspark", "speculators"]
    result = CliRunner().invoke(cli, ["convert", str(fixture("dspark")), str(tmp_path / "o"), "--to", "k3_dspark",
                                      "--json"])
    assert result.exit_code == 2 and not (tmp_path / "o").exists()
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "CONVERSION_REFUSED" and "not lossless" in error["message"]
    assert "not lossless" in result.stderr


def test_a_trainer_named_k3_export_is_still_converted(tmp_path):
    src = write_checkpoint(tmp_path / "src", mutate=lambda t: t.__setitem__("fc.weight", t.pop("context_proj.weight")))
    report = convert(src, tmp_path / "out")
    assert report.verify_ok and ("rename", "fc.weight") in {(c.kind, c.target) for c in report.changes}


@pytest.mark.parametrize("args", [["export-code", "{src}"], ["golden", "{src}", "-o", "{tmp}/g.safetensors"]])
def test_k3_only_tools_refuse_a_speculators_checkpoint_in_one_line(tmp_path, args):
    src = copy_fixture(tmp_path, "dspark")
    before = (src / "config.json").read_bytes()
    result = CliRunner().invoke(cli, [a.format(src=src, tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    assert "speculators_model_type is 'dspark': not a k3_dspark draft" in result.stderr
    assert (src / "config.json").read_bytes() == before and not (src / "modeling_k3_dspark.py").exists()
