"""verify on checkpoints the real speculators library saved: a verdict for each, a named culprit for each defect."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.verify.checks import verify
from dspark_hub.verify.family import FAMILIES

from .factories import write_checkpoint
from .spec_fixtures import (
    DSPARK,
    FAMILY_OF,
    OTHERS,
    VERIFIER,
    add,
    copy_fixture,
    drop,
    edit_config,
    edit_tensors,
    fixture,
    rename,
    reshape,
    set_key,
)

#: Findings a conforming fixture may carry: what vLLM 0.32.0 cannot serve is a warning, not an error.
EXPECTED = {"dspark-gated-markov": {("SERVING_UNSUPPORTED", "config.json:markov_head_type")},
            "dspark-rnn-markov": {("SERVING_UNSUPPORTED", "config.json:markov_head_type")}}


def found(report):
    return {(f.code, f.where) for f in report.findings}


@pytest.mark.parametrize("name", DSPARK)
def test_every_speculators_dspark_passes_its_own_contract(name):
    report = verify(fixture(name))
    assert report.ok and found(report) == EXPECTED.get(name, set()), [f.to_dict() for f in report.findings]
    assert report.summary.format == "speculators_dspark"
    assert report.summary.parameters["trained"] + report.summary.parameters["frozen"] == \
        report.summary.parameters["total"]


@pytest.mark.parametrize("name", OTHERS)
def test_every_other_speculators_family_gets_one_finding_naming_it(name):
    report = verify(fixture(name))
    family = FAMILIES[f"speculators_{FAMILY_OF[name]}"]
    assert [(f.code, f.where) for f in report.findings] == [("FOREIGN_DRAFT_FAMILY",
                                                             "config.json:speculators_model_type")]
    message, hint = report.findings[0].message, report.findings[0].hint
    assert message.startswith(f"this is {family.title}, not a draft format dspark-hub verifies")
    assert (f"vllm {family.methods['vllm']}" in hint) if family.methods["vllm"] else "no runtime method known" in hint
    assert report.sections["family"]["family"] == family.name


# ---------------------------------------------------------------- tensor defects, each named

@pytest.mark.parametrize("fixture_name,mutation,expected", [
    ("dspark", rename("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.query.weight"),
     {("UNEXPECTED_TENSOR", "layers.0.self_attn.query.weight"),
      ("MISSING_TENSOR", "layers.0.self_attn.q_proj.weight")}),
    ("dspark", rename("fc.weight", "context_proj.weight"), {("TRAINER_NAME", "context_proj.weight")}),
    ("dspark", drop("markov_head.markov_w2.weight"), {("MISSING_TENSOR", "markov_head.markov_w2.weight")}),
    ("dspark", add("embed_tokens.weight", (256, 64)), {("UNEXPECTED_TENSOR", "embed_tokens.weight")}),
    ("dspark", reshape("fc.weight", (64, 128)), {("SHAPE_MISMATCH", "fc.weight")}),
    ("dspark", reshape("layers.1.self_attn.k_proj.weight", (64, 64)),
     {("SHAPE_MISMATCH", "layers.1.self_attn.k_proj.weight")}),
    ("dspark-pruned-vocab", drop("d2t"), {("MISSING_TENSOR", "d2t")}),
    ("dspark-pruned-vocab", drop("lm_head.weight"), {("MISSING_TENSOR", "lm_head.weight")}),
    ("dspark-pruned-vocab", lambda t: t.__setitem__("t2d", t["t2d"].to(torch.int64)), {("DTYPE_MISMATCH", "t2d")}),
    ("dspark-gated-markov", drop("markov_head.gate_proj.bias"), {("MISSING_TENSOR", "markov_head.gate_proj.bias")}),
])
def test_tensor_defects_are_named(tmp_path, fixture_name, mutation, expected):
    folder = edit_tensors(copy_fixture(tmp_path, fixture_name), mutation)
    report = verify(folder)
    errors = {(f.code, f.where) for f in report.errors}
    assert errors == expected, [f.to_dict() for f in report.errors]
    assert not {(c, w) for c, w in found(verify(fixture(fixture_name))) if (c, w) in expected}   # passing twin


def test_k3_name_in_a_speculators_checkpoint_gets_the_speculators_hint(tmp_path):
    folder = edit_tensors(copy_fixture(tmp_path, "dspark"), rename("norm.weight", "final_norm.weight"))
    (finding,) = verify(folder).errors
    assert finding.hint.startswith("rename final_norm.weight -> norm.weight") and "k3_dspark name" in finding.message


def test_float32_tensor_in_a_bf16_checkpoint(tmp_path):
    folder = edit_tensors(copy_fixture(tmp_path, "dspark"), lambda t: t.__setitem__("norm.weight",
                                                                                  t["norm.weight"].float()))
    assert {(f.code, f.where) for f in verify(folder).errors} == {("DTYPE_MISMATCH", "norm.weight"),
                                                                  ("TORCH_DTYPE_MISMATCH", "config.json:dtype")}


# ---------------------------------------------------------------- config rules, each named

TLC = "transformer_layer_config"
RULES = [
    # (key, value, severity, code, where)
    ("aux_hidden_state_layer_ids", [5, 3, 3], "error", "CONFIG_RULE", "aux_hidden_state_layer_ids"),
    ("aux_hidden_state_layer_ids", [-1, 3, 5], "error", "CONFIG_RULE", "aux_hidden_state_layer_ids"),
    ("aux_hidden_state_layer_ids", [5, 3, 1], "warning", "CONFIG_RULE", "aux_hidden_state_layer_ids"),
    ("aux_hidden_state_layer_ids", ..., "error", "CONFIG_MISSING_KEY", "aux_hidden_state_layer_ids"),
    ("mask_token_id", 99999, "error", "CONFIG_RULE", "mask_token_id"),
    ("mask_token_id", None, "error", "CONFIG_RULE", "mask_token_id"),
    ("mask_token_id", ..., "error", "CONFIG_MISSING_KEY", "mask_token_id"),
    ("markov_head_type", "lstm", "error", "CONFIG_RULE", "markov_head_type"),
    ("markov_head_type", "rnn", "warning", "SERVING_UNSUPPORTED", "markov_head_type"),
    ("markov_rank", 0, "error", "CONFIG_RULE", "confidence_head_with_markov"),
    ("markov_rank", "16", "error", "CONFIG_RULE", "markov_rank"),
    ("draft_vocab_size", 300, "error", "CONFIG_RULE", "draft_vocab_size"),
    ("draft_vocab_size", ..., "error", "CONFIG_MISSING_KEY", "draft_vocab_size"),
    ("target_hidden_size", 128, "error", "CONFIG_RULE", "target_hidden_size"),
    ("block_size", 0, "error", "CONFIG_RULE", "block_size"),
    ("block_size", 2.5, "error", "CONFIG_RULE", "block_size"),
    ("enable_confidence_head", "yes", "error", "CONFIG_RULE", "enable_confidence_head"),
    ("enable_confidence_head", ..., "warning", "CONFIG_MISSING_KEY", "enable_confidence_head"),
    ("sample_from_anchor", ..., "warning", "CONFIG_MISSING_KEY", "sample_from_anchor"),
    ("sliding_window_non_causal", True, "warning", "SERVING_UNSUPPORTED", "sliding_window_non_causal"),
    ("markov_rank", ..., "warning", "CONFIG_MISSING_KEY", "markov_rank"),
    ("dtype", ..., "warning", "CONFIG_RULE", "dtype"),
    ("speculators_config.proposal_methods.0", None, "error", "CONFIG_RULE", "speculators_config.proposal_methods"),
    ("speculators_config.default_proposal_method", "tree", "error", "CONFIG_RULE",
     "speculators_config.default_proposal_method"),
    ("speculators_config.verifier", {"architectures": ["Qwen3ForCausalLM"]}, "error", "CONFIG_RULE",
     "speculators_config.verifier"),
    ("speculators_config", None, "error", "CONFIG_RULE", "speculators_config"),
    ("speculators_config", ..., "error", "CONFIG_MISSING_KEY", "speculators_config"),
    (f"{TLC}.model_type", "llama", "error", "CONFIG_RULE", f"{TLC}.model_type"),
    (f"{TLC}.num_key_value_heads", 3, "error", "CONFIG_RULE", f"{TLC}.num_key_value_heads"),
    (f"{TLC}.hidden_size", ..., "error", "CONFIG_MISSING_KEY", f"{TLC}.hidden_size"),
    (f"{TLC}.vocab_size", 0, "error", "CONFIG_RULE", f"{TLC}.vocab_size"),
    (TLC, ..., "error", "CONFIG_MISSING_KEY", TLC),
]


@pytest.mark.parametrize("key,value,severity,code,where", RULES, ids=[f"{r[0]}={r[1]!r}" for r in RULES])
def test_each_config_rule_names_its_culprit(tmp_path, key, value, severity, code, where):
    folder = copy_fixture(tmp_path, "dspark")
    if key == "speculators_config.proposal_methods.0":
        edit_config(folder, lambda c: c["speculators_config"].update(proposal_methods=[]))
    else:
        edit_config(folder, set_key(key, value))
    report = verify(folder)
    hits = [f for f in report.findings if (f.code, f.where) == (code, f"config.json:{where}")]
    assert [f.severity for f in hits] == [severity], [f.to_dict() for f in report.findings]
    assert "[speculators 0.9.0" in hits[0].message or "[vLLM 0.32.0" in hits[0].message   # the source note
    assert "executed]" in hits[0].message or "read]" in hits[0].message
    assert not [f for f in verify(fixture("dspark")).findings if f.where == f"config.json:{where}"]   # twin


@pytest.mark.parametrize("field,value", [("proposal_type", "beam"), ("speculative_tokens", 0),
                                         ("verifier_accept_k", 0), ("accept_tolerance", -1.0)])
def test_each_proposal_field_is_checked(tmp_path, field, value):
    folder = edit_config(copy_fixture(tmp_path, "dspark"),
                         lambda c: c["speculators_config"]["proposal_methods"][0].update({field: value}))
    where = f"config.json:speculators_config.proposal_methods[0].{field}"
    assert ("CONFIG_RULE", where) in {(f.code, f.where) for f in verify(folder).errors}


def test_speculative_tokens_other_than_training_writes_is_a_warning(tmp_path):
    folder = edit_config(copy_fixture(tmp_path, "dspark"),
                         lambda c: c["speculators_config"]["proposal_methods"][0].update(speculative_tokens=7))
    report = verify(folder)
    assert report.ok
    (finding,) = [f for f in report.findings if f.code == "CONFIG_RULE"]
    assert finding.severity == "warning" and "training writes 4 for block_size 4" in finding.message


def test_a_config_that_says_rnn_over_vanilla_tensors_names_the_missing_rnn_head(tmp_path):
    folder = edit_config(copy_fixture(tmp_path, "dspark"), set_key("markov_head_type", "rnn"))
    errors = {(f.code, f.where) for f in verify(folder).errors}
    assert errors == {("MISSING_TENSOR", "markov_head.joint_proj.weight"),
                      ("MISSING_TENSOR", "markov_head.joint_proj.bias")}


def test_one_undecidable_roster_key_is_said_once(tmp_path):
    folder = edit_config(copy_fixture(tmp_path, "dspark"), set_key("markov_rank", 0))
    report = verify(folder)
    assert [f.code for f in report.errors] == ["CONFIG_RULE"]    # no second ROSTER_UNDECIDABLE at the same key


# ---------------------------------------------------------------- a config.py beside the config

def test_config_py_is_never_imported_or_executed(tmp_path):
    folder = copy_fixture(tmp_path, "dspark")
    marker = tmp_path / "imported"
    (folder / "config.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(3)\n")
    assert json.loads((folder / "config.json").read_text())["auto_map"] == {"": "config.DSparkSpeculatorConfig"}
    report = verify(folder, runtime="all", target=VERIFIER)
    result = CliRunner().invoke(cli, ["verify", str(folder), "--deep", "--json"])
    assert report.ok and result.exit_code == 0, result.output
    assert not marker.exists()


# ---------------------------------------------------------------- drop-in

def test_drop_in_against_another_speculators_checkpoint(tmp_path):
    same = verify(fixture("dspark"), drop_in=str(copy_fixture(tmp_path, "dspark", "twin")))
    assert same.ok and not same.findings
    other = verify(fixture("dspark"), drop_in=str(fixture("dspark-f32")))
    codes = {f.code for f in other.errors}
    assert codes == {"DROPIN_CONFIG_VALUE", "DROPIN_DTYPE", "DROPIN_FILE_SIZE"}
    layout = verify(fixture("dspark-sharded"), drop_in=str(fixture("dspark")))
    assert {f.code for f in layout.errors} == {"DROPIN_LAYOUT"}


@pytest.mark.parametrize("name", ["dspark", "dspark-pruned-vocab", "eagle3", "mtp", "xpress"])
def test_drop_in_kimi_k3_on_another_family_is_one_finding_naming_both(name):
    report = verify(fixture(name), drop_in="kimi-k3")
    (finding,) = report.findings
    assert finding.code == "DROPIN_FAMILY" and finding.severity == "error"
    assert FAMILIES[f"speculators_{FAMILY_OF[name]}"].title in finding.message
    assert "kimi-k3 is an MLA k3_dspark draft" in finding.message


def test_a_k3_draft_against_a_speculators_reference_is_one_finding(tmp_path):
    report = verify(write_checkpoint(tmp_path / "k3"), drop_in=str(fixture("dspark")))
    assert [f.code for f in report.findings] == ["DROPIN_FAMILY"]
    assert "an MLA k3_dspark draft" in report.findings[0].message


# ---------------------------------------------------------------- bytes, checksums, the Hub

@pytest.mark.parametrize("name", ["dspark-pruned-vocab", "dspark-sharded", "dspark-f32"])
def test_deep_streams_every_file_including_the_int_and_bool_maps(name):
    report = verify(fixture(name), deep=True)
    assert report.ok, [f.to_dict() for f in report.findings]
    tensors = report.sections["deep"]["tensors"]
    assert len(tensors) == report.summary.tensors
    assert len(report.sections["deep"]["files"]) == len(report.summary.files)
    if name == "dspark-pruned-vocab":
        assert tensors["t2d"]["dtype"] == "BOOL" and tensors["d2t"]["dtype"] == "I64"


def test_deep_names_an_all_zero_matrix(tmp_path):
    folder = edit_tensors(copy_fixture(tmp_path, "dspark"), reshape("layers.0.mlp.up_proj.weight", (128, 64)))
    assert verify(folder).ok                          # header level: nothing to see
    assert [(f.code, f.where) for f in verify(folder, deep=True).errors] == [
        ("TENSOR_ALL_ZERO", "layers.0.mlp.up_proj.weight")]


def test_checksums_round_trip_on_a_speculators_checkpoint(tmp_path):
    from dspark_hub.hub.checksums import check_checksums, write_checksums

    folder = copy_fixture(tmp_path, "dspark-sharded")
    write_checksums(folder)
    assert check_checksums(folder).problems == []
    (folder / "model-00002-of-00005.safetensors").write_bytes(b"x")
    assert [(p.path, p.kind) for p in check_checksums(folder).problems] == [
        ("model-00002-of-00005.safetensors", "mismatch")]


def test_remote_verify_of_a_speculators_checkpoint(hub, hub_repo_id, hub_token):
    from dspark_hub.format.remote import HubSource
    from dspark_hub.hub.publish import publish

    assert publish(fixture("dspark-pruned-vocab"), hub_repo_id, token=hub_token, endpoint=hub.url,
                   private=True).ok
    source = HubSource.from_url(f"hf://{hub_repo_id}", endpoint=hub.url, token=hub_token)
    remote = verify(source, target=VERIFIER)
    local = verify(fixture("dspark-pruned-vocab"), target=VERIFIER)
    assert remote.ok and remote.summary.format == "speculators_dspark"
    assert remote.summary.parameters == local.summary.parameters
    assert found(remote) == found(local)


# ---------------------------------------------------------------- --target

@pytest.mark.parametrize("name", DSPARK)
def test_target_gives_no_false_errors(name):
    report = verify(fixture(name), target=VERIFIER)
    assert report.ok, [f.to_dict() for f in report.errors]
    assert "PAIRING_OK" in report.codes()
    draft = report.sections["pairing"]["draft"]
    assert draft["native_layer_ids"] == [1, 3, 5] and draft["target_layer_ids"] == [0, 2, 4]   # k - 1
    assert report.sections["pairing"]["embedding"] is None     # speculators saves no embed_tokens


def _target(tmp_path, **changes):
    out = copy_fixture(tmp_path, "verifier-qwen3-tiny", "target")
    return edit_config(out, lambda c: c.update(changes))


@pytest.mark.parametrize("changes,code,where", [
    ({"vocab_size": 512}, "PAIRING_VOCAB", "transformer_layer_config.vocab_size"),
    ({"hidden_size": 128}, "PAIRING_HIDDEN_SIZE", "transformer_layer_config.hidden_size"),
    ({"num_hidden_layers": 4}, "PAIRING_LAYER_ID", "aux_hidden_state_layer_ids"),
])
def test_target_mismatches_are_named(tmp_path, changes, code, where):
    report = verify(fixture("dspark"), target=_target(tmp_path, **changes))
    assert (code, f"config.json:{where}") in {(f.code, f.where) for f in report.errors}


def test_last_layer_output_is_a_valid_aux_id_and_one_past_is_not(tmp_path):
    six = edit_config(copy_fixture(tmp_path, "dspark"), set_key("aux_hidden_state_layer_ids", [0, 3, 6]))
    assert verify(six, target=VERIFIER).ok           # 0 = embedding output, 6 = the last layer's output
    seven = edit_config(copy_fixture(tmp_path, "dspark", "seven"), set_key("aux_hidden_state_layer_ids", [1, 3, 7]))
    (finding,) = verify(seven, target=VERIFIER).errors
    assert finding.code == "PAIRING_LAYER_ID" and "[7]" in finding.message


def test_another_verifier_architecture_is_a_warning(tmp_path):
    report = verify(fixture("dspark"), target=_target(tmp_path, architectures=["LlamaForCausalLM"]))
    assert report.ok and ("PAIRING_VERIFIER", "config.json:speculators_config.verifier") in found(report)


def test_pruned_draft_vocab_larger_than_the_target_is_named(tmp_path):
    folder = edit_config(copy_fixture(tmp_path, "dspark-pruned-vocab"), set_key("draft_vocab_size", 64))
    report = verify(folder, target=_target(tmp_path, vocab_size=32))
    assert ("PAIRING_VOCAB", "config.json:draft_vocab_size") in {(f.code, f.where) for f in report.errors}


def test_cli_json_for_a_speculators_checkpoint(tmp_path):
    result = CliRunner().invoke(cli, ["verify", str(fixture("dspark")), "--target", str(VERIFIER), "--json"])
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["summary"]["format"] == "speculators_dspark"
    assert doc["summary"]["parameters"] == {"total": 94_801, "trained": 94_801, "frozen": 0, "maps": 0}


def test_cli_human_output_with_target_and_runtime():
    result = CliRunner().invoke(cli, ["verify", str(fixture("dspark-pruned-vocab")), "--target", str(VERIFIER),
                                      "--runtime", "vllm"])
    assert result.exit_code == 0, result.output
    assert "embedding: not compared (the draft saves none)" in result.stdout
    assert "4,096 frozen (lm_head); 320 vocabulary-map elements (not parameters)" in result.stdout
