"""verify(): one failing fixture per check, each against the same passing twin."""

from __future__ import annotations

import json

import pytest
import torch

from dspark_hub.errors import CheckpointNotFoundError, UsageError
from dspark_hub.format import contract
from dspark_hub.verify.checks import verify

from .factories import raw_safetensors, sparse_reference, tensors_for, tiny_config, write_checkpoint


def codes_at(report):
    return {(f.code, f.where) for f in report.findings}


def errors_of(report):
    return {f.code for f in report.findings if f.severity == "error"}


@pytest.fixture
def good(tmp_path):
    return write_checkpoint(tmp_path / "good")


def test_passing_twin(good):
    report = verify(good)
    assert report.ok, [f.to_dict() for f in report.findings]
    assert report.findings == []
    s = report.summary
    counts = contract.parameter_counts(contract.TINY_CONFIG)
    assert (s.layout, s.tensors, s.dtypes) == ("single", 32, {"BF16": 32})
    assert s.parameters == counts.to_dict()
    assert s.bytes == (good / "model.safetensors").stat().st_size


def test_missing_path_is_a_usage_error(tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        verify(tmp_path / "nope")


# ----------------------------------------------------------------- config

@pytest.mark.parametrize("key,value", [
    ("num_hidden_layers", 0),
    ("target_layer_ids", []),
    ("target_layer_ids", [1, 3]),            # length != num_target_layers
    ("target_layer_ids", [3, 1, 4]),         # not ascending
    ("target_layer_ids", [1, 1, 4]),         # not distinct
    ("target_layer_ids", [1, 3, 6]),         # == target_num_hidden_layers
    ("target_layer_ids", "1,3,4"),
    ("mask_token_id", 512),                  # == vocab_size
    ("mask_token_id", -1),
    ("markov_head_type", "gated"),
    ("markov_head_type", "mystery"),
    ("aux_hidden_stream", "suffix"),
    ("mla_use_nope", True),
    ("mla_use_output_gate", True),
    ("architectures", ["DeepseekV3ForCausalLM"]),
])
def test_runtime_startup_rules(tmp_path, key, value):
    folder = write_checkpoint(tmp_path / "c", config=tiny_config(**{key: value}),
                              tensors=tensors_for(contract.TINY_CONFIG))
    report = verify(folder)
    assert ("CONFIG_RULE", f"config.json:{key}") in codes_at(report)
    assert not report.ok


@pytest.mark.parametrize("key,value", [("markov_rank", 0), ("q_lora_rank", 0)])
def test_zero_ranks_are_rule_violations(tmp_path, key, value):
    folder = write_checkpoint(tmp_path / "c", config=tiny_config(**{key: value}),
                              tensors=tensors_for(contract.TINY_CONFIG))
    report = verify(folder)
    assert ("CONFIG_RULE", f"config.json:{key}") in codes_at(report)


def test_aux_hidden_stream_attn_res_is_accepted(tmp_path):
    folder = write_checkpoint(tmp_path / "c", config=tiny_config(aux_hidden_stream="attn_res"))
    assert verify(folder).ok


def test_rope_interleave_is_forbidden(tmp_path):
    report = verify(write_checkpoint(tmp_path / "c", config=tiny_config(rope_interleave=True)))
    finding = next(f for f in report.findings if f.code == "FORBIDDEN_KEY")
    assert finding.where == "config.json:rope_interleave" and "half-split" in finding.message


@pytest.mark.parametrize("key", ["mask_token_id", "target_layer_ids", "rope_parameters"])
def test_required_key_missing(tmp_path, key):
    config = tiny_config(**{key: ...})
    report = verify(write_checkpoint(tmp_path / "c", config=config, tensors=tensors_for(contract.TINY_CONFIG)))
    assert ("CONFIG_MISSING_KEY", f"config.json:{key}") in codes_at(report)
    assert not report.ok


def test_optional_key_missing_is_a_warning(tmp_path):
    report = verify(write_checkpoint(tmp_path / "c", config=tiny_config(_torchspec_version=...)))
    assert report.ok
    assert ("CONFIG_MISSING_KEY", "config.json:_torchspec_version") in codes_at(report)


def test_config_missing(good):
    (good / "config.json").unlink()
    report = verify(good)
    assert errors_of(report) == {"CONFIG_MISSING"}


def test_config_duplicate_key(good):
    text = (good / "config.json").read_text()
    (good / "config.json").write_text(text.replace('"hidden_size": 64,', '"hidden_size": 64, "hidden_size": 128,'))
    report = verify(good)
    assert ("CONFIG_DUPLICATE_KEY", "config.json:hidden_size") in codes_at(report)


def test_config_not_json(good):
    (good / "config.json").write_text("{ not json")
    assert ("CONFIG_INVALID_JSON", "config.json") in codes_at(verify(good))


def test_speculators_format_is_checked_against_its_own_contract_not_k3(tmp_path):
    config = {"architectures": ["DSparkSpeculator"], "speculators_model_type": "dspark", "block_size": 8,
              "transformer_layer_config": {"model_type": "qwen3"}}
    folder = write_checkpoint(tmp_path / "s", config=config, tensors={"fc.weight": torch.zeros(4, 4)})
    report = verify(folder)
    assert report.summary.format == "speculators_dspark"
    wheres = {f.where for f in report.errors}
    assert "config.json:aux_hidden_state_layer_ids" in wheres
    assert "config.json:transformer_layer_config.hidden_size" in wheres
    assert not any("context_proj" in f.where or "q_a_proj" in f.where for f in report.findings)   # no k3 wall


def test_other_model_type_is_named(tmp_path):
    folder = write_checkpoint(tmp_path / "o", config={"model_type": "llama"}, tensors={"x": torch.zeros(2)})
    report = verify(folder)
    assert errors_of(report) == {"WRONG_MODEL_TYPE"}
    assert "llama" in report.findings[0].message


def test_torch_dtype_must_match_tensors(tmp_path):
    folder = write_checkpoint(tmp_path / "f", tensors=tensors_for(contract.TINY_CONFIG, dtype=torch.float32))
    report = verify(folder)
    assert ("TORCH_DTYPE_MISMATCH", "config.json:torch_dtype") in codes_at(report)
    assert "DTYPE_MISMATCH" in errors_of(report)


# ----------------------------------------------------------------- roster

def test_missing_tensor(tmp_path):
    report = verify(write_checkpoint(tmp_path / "m", mutate=lambda t: t.pop("layers.1.mlp.up_proj.weight")))
    assert codes_at(report) == {("MISSING_TENSOR", "layers.1.mlp.up_proj.weight")}


def test_unexpected_tensor(tmp_path):
    def add(t):
        t["layers.2.mlp.up_proj.weight"] = torch.zeros(2, dtype=torch.bfloat16)
    report = verify(write_checkpoint(tmp_path / "u", mutate=add))
    assert codes_at(report) == {("UNEXPECTED_TENSOR", "layers.2.mlp.up_proj.weight")}


def test_transposed_shape(tmp_path):
    def transpose(t):
        t["context_proj.weight"] = t["context_proj.weight"].T.contiguous()
    report = verify(write_checkpoint(tmp_path / "s", mutate=transpose))
    finding = next(f for f in report.findings if f.code == "SHAPE_MISMATCH")
    assert finding.where == "context_proj.weight" and "transposed" in finding.hint


def test_wrong_dtype(tmp_path):
    def fp16(t):
        t["final_norm.weight"] = t["final_norm.weight"].half()
    report = verify(write_checkpoint(tmp_path / "d", mutate=fp16))
    assert ("DTYPE_MISMATCH", "final_norm.weight") in codes_at(report)
    assert errors_of(report) == {"DTYPE_MISMATCH", "TORCH_DTYPE_MISMATCH"}


def test_trainer_names_get_the_zero_acceptance_hint(tmp_path):
    def rename(t):
        for wrong, right in contract.KNOWN_MISNAMES.items():
            t[wrong] = t.pop(right)
    report = verify(write_checkpoint(tmp_path / "t", mutate=rename))
    assert codes_at(report) == {("TRAINER_NAME", n) for n in contract.KNOWN_MISNAMES}
    assert all("0% acceptance" in f.message for f in report.findings)


def test_model_prefix_is_one_finding(tmp_path):
    def prefix(t):
        for name in list(t):
            t["model." + name] = t.pop(name)
    report = verify(write_checkpoint(tmp_path / "p", mutate=prefix))
    assert codes_at(report) == {("FOREIGN_PREFIX", "model.*")}
    assert report.findings[0].message.startswith("32 tensors carry the 'model.' prefix")


def test_one_prefixed_tensor_is_counted_in_the_singular(tmp_path):
    report = verify(write_checkpoint(tmp_path / "p", mutate=lambda t: t.update(
        {"model.final_norm.weight": t.pop("final_norm.weight")})))
    [finding] = [f for f in report.findings if f.code == "FOREIGN_PREFIX"]
    assert finding.message.startswith("1 tensor carries the 'model.' prefix (e.g. model.final_norm.weight)")


def test_shipped_lm_head_is_a_warning(tmp_path):
    def lm_head(t):
        t["lm_head.weight"] = torch.zeros(512, 64, dtype=torch.bfloat16)
    report = verify(write_checkpoint(tmp_path / "l", mutate=lm_head))
    assert report.ok and codes_at(report) == {("SHIPPED_LM_HEAD", "lm_head.weight")}
    assert "SHIPPED_LM_HEAD" in errors_of(verify(tmp_path / "l", drop_in=str(write_checkpoint(tmp_path / "ref"))))


def test_confidence_head_without_markov_changes_the_roster(tmp_path):
    config = tiny_config(confidence_head_with_markov=False)
    assert contract.roster(config)["confidence_head.proj.weight"].shape == (1, 64)
    assert verify(write_checkpoint(tmp_path / "c", config=config)).ok


# ----------------------------------------------------------------- files

def test_broken_weights_file_is_a_finding_not_a_crash(good):
    raw_safetensors(good / "model.safetensors", b'{"a": 1, "a": 2}')
    report = verify(good)
    assert ("DUPLICATE_KEY", "model.safetensors:a") in codes_at(report)


def test_no_weights(good):
    (good / "model.safetensors").unlink()
    assert errors_of(verify(good)) == {"NO_WEIGHTS"}


def test_only_a_pickle_is_named_and_not_read(good):
    (good / "model.safetensors").unlink()
    (good / "pytorch_model.bin").write_bytes(b"\x80\x04 not a pickle anyone may load")
    [finding] = [f for f in verify(good).findings if f.code == "NO_WEIGHTS"]
    assert finding.where == "pytorch_model.bin"
    assert "pytorch_model.bin" in finding.message and "pickle" in finding.message
    assert "safetensors" in finding.hint


@pytest.mark.parametrize("config, where", [
    ('{"num_hidden_layers": NaN}', "config.json:num_hidden_layers"),
    ('{"rope_parameters": {"factor": Infinity}}', "config.json:rope_parameters.factor"),
])
def test_a_nan_in_config_json_names_its_key(tmp_path, config, where):
    folder = write_checkpoint(tmp_path / "n", config=config, tensors=tensors_for(contract.TINY_CONFIG))
    [finding] = verify(folder).errors
    assert (finding.code, finding.where) == ("CONFIG_INVALID_JSON", where)


@pytest.mark.parametrize("fixture, key", [
    (None, "num_hidden_layers"),
    ("dspark", "transformer_layer_config.num_hidden_layers"),
])
def test_a_layer_count_written_as_a_string_is_said_once(tmp_path, fixture, key):
    from .spec_fixtures import copy_fixture, edit_config, set_key

    if fixture is None:
        folder = write_checkpoint(tmp_path / "s", config=tiny_config(num_hidden_layers="2"),
                                  tensors=tensors_for(contract.TINY_CONFIG))
    else:
        folder = edit_config(copy_fixture(tmp_path, fixture), set_key(key, "2"))
    at_key = [f for f in verify(folder).findings if f.where == f"config.json:{key}"]
    assert len(at_key) == 1, [f.to_dict() for f in at_key]
    assert '"2"' in at_key[0].message and "integer" in at_key[0].message


def test_empty_metadata_warns(tmp_path):
    report = verify(write_checkpoint(tmp_path / "e", metadata={}))
    assert report.ok and ("EMPTY_METADATA", "model.safetensors") in codes_at(report)


# ----------------------------------------------------------------- shards

def test_sharded_passing_twin(tmp_path):
    report = verify(write_checkpoint(tmp_path / "s", shards=3))
    assert report.ok and report.findings == []
    assert report.summary.layout == "sharded" and len(report.summary.files) == 3


def _index(folder):
    return json.loads((folder / contract.INDEX_NAME).read_text())


def _write_index(folder, doc):
    (folder / contract.INDEX_NAME).write_text(json.dumps(doc))


def test_index_names_missing_file(tmp_path):
    folder = write_checkpoint(tmp_path / "s", shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    report = verify(folder)
    assert ("INDEX_MISSING_FILE", "model-00002-of-00002.safetensors") in codes_at(report)


def test_index_maps_tensor_to_wrong_file(tmp_path):
    folder = write_checkpoint(tmp_path / "s", shards=2)
    doc = _index(folder)
    doc["weight_map"]["final_norm.weight"] = "model-00002-of-00002.safetensors" \
        if doc["weight_map"]["final_norm.weight"].startswith("model-00001") else "model-00001-of-00002.safetensors"
    _write_index(folder, doc)
    assert ("INDEX_WRONG_FILE", "final_norm.weight") in codes_at(verify(folder))


def test_index_unsafe_path_is_a_finding(tmp_path):
    folder = write_checkpoint(tmp_path / "s", shards=2)
    doc = _index(folder)
    doc["weight_map"]["final_norm.weight"] = "../elsewhere.safetensors"
    _write_index(folder, doc)
    assert ("INDEX_UNSAFE_PATH", "model.safetensors.index.json:final_norm.weight") in codes_at(verify(folder))


def test_index_total_size(tmp_path):
    folder = write_checkpoint(tmp_path / "s", shards=2)
    doc = _index(folder)
    doc["metadata"]["total_size"] += 2
    _write_index(folder, doc)
    assert ("INDEX_TOTAL_SIZE", contract.INDEX_NAME) in codes_at(verify(folder))


def test_tensor_in_two_files(tmp_path):
    from safetensors.torch import save_file
    folder = write_checkpoint(tmp_path / "s", shards=2)
    doc = _index(folder)
    name = next(n for n, f in doc["weight_map"].items() if f.startswith("model-00001"))
    extra = {name: torch.ones(contract.roster(contract.TINY_CONFIG)[name].shape, dtype=torch.bfloat16)}
    save_file(extra, str(folder / "model-00003-of-00003.safetensors"))
    doc["weight_map"]["zz"] = "model-00003-of-00003.safetensors"
    _write_index(folder, doc)
    assert ("TENSOR_IN_TWO_FILES", name) in codes_at(verify(folder))


def test_tensor_not_in_index(tmp_path):
    folder = write_checkpoint(tmp_path / "s", shards=2)
    doc = _index(folder)
    del doc["weight_map"]["final_norm.weight"]
    _write_index(folder, doc)
    assert ("INDEX_UNLISTED_TENSOR", "final_norm.weight") in codes_at(verify(folder))


def test_several_files_without_index(tmp_path):
    folder = write_checkpoint(tmp_path / "s", shards=2)
    (folder / contract.INDEX_NAME).unlink()
    assert "INDEX_MISSING" in errors_of(verify(folder))


# ----------------------------------------------------------------- drop-in

def test_reference_shape_passes_drop_in_kimi_k3(tmp_path):
    report = verify(sparse_reference(tmp_path / "ref"), drop_in="kimi-k3")
    assert report.ok, [f.to_dict() for f in report.findings]
    assert report.summary.parameters == {"total": 3_562_312_961, "trained": 2_387_907_841,
                                         "frozen": 1_174_405_120, "maps": 0}
    assert report.summary.tensors == 68 and report.summary.bytes == 7_124_633_450


def test_markov_rank_variant_is_self_consistent_but_not_a_drop_in(tmp_path):
    variant = dict(contract.REFERENCE_CONFIG, markov_rank=512)
    folder = sparse_reference(tmp_path / "v", variant)
    assert verify(folder).ok
    report = verify(folder, drop_in="kimi-k3")
    found = codes_at(report)
    assert ("DROPIN_CONFIG_VALUE", "config.json:markov_rank") in found
    assert ("DROPIN_SHAPE", "confidence_head.proj.weight") in found
    assert ("DROPIN_SHAPE", "markov_head.markov_w1.weight") in found
    head = next(f for f in report.findings if f.where == "confidence_head.proj.weight")
    assert "[1, 7680]" in head.message and "[1, 7424]" in head.message


def test_drop_in_against_a_local_folder(tmp_path):
    ref = write_checkpoint(tmp_path / "ref")
    assert verify(write_checkpoint(tmp_path / "same", tensors=tensors_for(contract.TINY_CONFIG, seed=1)),
                  drop_in=str(ref)).ok
    other = write_checkpoint(tmp_path / "other", config=tiny_config(markov_rank=32))
    report = verify(other, drop_in=str(ref))
    assert verify(other).ok and not report.ok
    assert ("DROPIN_CONFIG_VALUE", "config.json:markov_rank") in codes_at(report)


def test_drop_in_allows_auto_map_only(tmp_path):
    ref = write_checkpoint(tmp_path / "ref")
    with_map = write_checkpoint(tmp_path / "am", config=tiny_config(auto_map={"AutoModel": "m.K"}))
    report = verify(with_map, drop_in=str(ref))
    assert report.ok and ("DROPIN_ALLOWED_EXTRA_KEY", "config.json:auto_map") in codes_at(report)
    extra = write_checkpoint(tmp_path / "ex", config=tiny_config(use_cache=True))
    assert ("DROPIN_CONFIG_EXTRA_KEY", "config.json:use_cache") in codes_at(verify(extra, drop_in=str(ref)))
    missing = write_checkpoint(tmp_path / "mi", config=tiny_config(_torchspec_version=...))
    assert ("DROPIN_CONFIG_KEY_MISSING", "config.json:_torchspec_version") in codes_at(
        verify(missing, drop_in=str(ref)))


def test_drop_in_layout_and_metadata(tmp_path):
    ref = write_checkpoint(tmp_path / "ref")
    sharded = write_checkpoint(tmp_path / "sh", shards=2)
    assert ("DROPIN_LAYOUT", "weights") in codes_at(verify(sharded, drop_in=str(ref)))
    meta = write_checkpoint(tmp_path / "md", metadata={"format": "pt"})
    assert ("DROPIN_METADATA", "model.safetensors") in codes_at(verify(meta, drop_in=str(ref)))


def test_drop_in_dtype_and_missing_tensor(tmp_path):
    ref = write_checkpoint(tmp_path / "ref")

    def change(t):
        t["final_norm.weight"] = t["final_norm.weight"].float()
        del t["confidence_head.proj.bias"]
    report = verify(write_checkpoint(tmp_path / "x", mutate=change), drop_in=str(ref))
    assert {("DROPIN_DTYPE", "final_norm.weight"), ("DROPIN_TENSOR_MISSING", "confidence_head.proj.bias")} \
        <= codes_at(report)


def test_drop_in_unknown_reference(good):
    with pytest.raises(UsageError):
        verify(good, drop_in="kimi-k4")


@pytest.mark.parametrize("rope", [[1], {"rope_type": "yarn", "factor": "x"}, {"rope_type": "linear", "factor": 2.0},
                                  {k: v for k, v in contract.TINY_CONFIG["rope_parameters"].items() if k != "factor"}])
def test_rope_parameters_must_be_the_yarn_block(tmp_path, rope):
    report = verify(write_checkpoint(tmp_path / "r", config=tiny_config(rope_parameters=rope),
                                     tensors=tensors_for(contract.TINY_CONFIG)))
    assert ("CONFIG_RULE", "config.json:rope_parameters") in codes_at(report) and not report.ok


def test_null_required_key_is_an_error(tmp_path):
    report = verify(write_checkpoint(tmp_path / "n", config=tiny_config(rope_parameters=None),
                                     tensors=tensors_for(contract.TINY_CONFIG)))
    finding = next(f for f in report.findings if f.code == "CONFIG_NULL_VALUE")
    assert finding.severity == "error" and finding.where == "config.json:rope_parameters"


def test_absurd_layer_count_is_one_finding_not_a_million(tmp_path):
    report = verify(write_checkpoint(tmp_path / "l", config=tiny_config(num_hidden_layers=10**6),
                                     tensors=tensors_for(contract.TINY_CONFIG)))
    assert [(f.code, f.where) for f in report.errors] == [("ROSTER_UNDECIDABLE", "config.json:num_hidden_layers")]


def test_dangling_symlink_is_a_finding_not_a_failure_to_list(good):
    (good / "tokenizer.json").symlink_to(good / "nowhere.json")
    report = verify(good)
    assert [(f.code, f.where) for f in report.errors] == [("FILE_UNREADABLE", "tokenizer.json")]
    assert report.summary.tensors == 32
