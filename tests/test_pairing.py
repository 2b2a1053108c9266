"""verify --target: a matching tiny teacher passes; each mismatch fails, naming what differs."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from dspark_hub.cli.main import cli
from dspark_hub.format import contract
from dspark_hub.verify.checks import verify

from .factories import tensors_for, tiny_config, write_checkpoint

TINY = contract.TINY_CONFIG
MASK = TINY["mask_token_id"]


def teacher_config(**changes):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": TINY["target_hidden_size"],
           "num_hidden_layers": TINY["target_num_hidden_layers"], "vocab_size": TINY["vocab_size"],
           "pad_token_id": 0, "eos_token_id": 2}
    cfg.update(changes)
    return cfg


def make_teacher(folder, embedding, *, config=None, tokenizer=True, mask_content="<|mask|>", mask_special=True):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config or teacher_config()))
    save_file({"model.embed_tokens.weight": embedding.clone(),
               "model.norm.weight": torch.ones(embedding.shape[1], dtype=embedding.dtype)},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer:
        decoder = {str(MASK): {"content": mask_content, "special": mask_special}}
        (folder / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    return folder


@pytest.fixture
def draft_tensors():
    return tensors_for(TINY)


@pytest.fixture
def draft(tmp_path, draft_tensors):
    return write_checkpoint(tmp_path / "draft", tensors=draft_tensors)


def pairing_errors(report):
    return {(f.code, f.where) for f in report.errors}


def test_matching_teacher_passes_and_is_recorded(tmp_path, draft, draft_tensors):
    teacher = make_teacher(tmp_path / "teacher", draft_tensors["embed_tokens.weight"])
    report = verify(draft, target=teacher)
    assert report.ok, [f.to_dict() for f in report.findings]
    assert "PAIRING_OK" in report.codes()
    section = report.sections["pairing"]
    assert section["embedding"]["identical"] is True
    assert section["embedding"]["draft"]["sha256"] == section["embedding"]["target"]["sha256"]
    assert section["config"]["sha256"] == hashlib.sha256((teacher / "config.json").read_bytes()).hexdigest()
    assert section["files"]["model.safetensors"]["size"] == (teacher / "model.safetensors").stat().st_size
    assert section["mask_token"] == {"id": MASK, "content": "<|mask|>", "special": True,
                                     "where": "tokenizer_config.json"}
    assert section["revision"] is None


@pytest.mark.parametrize("change,code,key", [
    ({"hidden_size": 96}, "PAIRING_HIDDEN_SIZE", "target_hidden_size"),
    ({"num_hidden_layers": 8}, "PAIRING_LAYER_COUNT", "target_num_hidden_layers"),
    ({"vocab_size": 520}, "PAIRING_VOCAB", "vocab_size"),
])
def test_config_mismatch_fails_naming_which(tmp_path, draft, draft_tensors, change, code, key):
    teacher = make_teacher(tmp_path / "t", draft_tensors["embed_tokens.weight"], config=teacher_config(**change))
    report = verify(draft, target=teacher)
    assert (code, f"config.json:{key}") in pairing_errors(report)
    assert str(next(iter(change.values()))) in next(f.message for f in report.errors if f.code == code)


def test_a_vocabulary_mismatch_is_one_finding_when_config_and_rows_agree(tmp_path, draft, draft_tensors):
    embed = draft_tensors["embed_tokens.weight"]
    bigger = torch.cat([embed, torch.zeros(8, embed.shape[1], dtype=embed.dtype)])
    teacher = make_teacher(tmp_path / "t", bigger, config=teacher_config(vocab_size=bigger.shape[0]))
    report = verify(draft, target=teacher)
    assert [f.code for f in report.errors].count("PAIRING_VOCAB") == 1


@pytest.mark.parametrize("drop", ["hidden_size", "num_hidden_layers"])
def test_a_target_that_names_nothing_to_pair_with_is_an_error(tmp_path, draft, draft_tensors, drop):
    config = teacher_config()
    del config[drop]
    report = verify(draft, target=make_teacher(tmp_path / "t", draft_tensors["embed_tokens.weight"], config=config))
    (finding,) = [f for f in report.errors if f.code == "PAIRING_NOT_A_TARGET"]
    assert drop in finding.message and "PAIRING_OK" not in report.codes()


def test_a_speculators_draft_given_as_its_own_target_does_not_pair():
    from .spec_fixtures import fixture

    report = verify(fixture("dspark"), target=fixture("dspark"))
    assert "PAIRING_NOT_A_TARGET" in report.codes() and "PAIRING_OK" not in report.codes()


def test_padded_vocabulary_in_the_embedding_fails(tmp_path, draft, draft_tensors):
    embed = draft_tensors["embed_tokens.weight"]
    padded = torch.cat([embed, torch.zeros(8, embed.shape[1], dtype=embed.dtype)])
    report = verify(draft, target=make_teacher(tmp_path / "t", padded))
    messages = [f.message for f in report.errors if f.code == "PAIRING_VOCAB"]
    assert messages and "520 rows" in messages[0]
    assert ("PAIRING_EMBEDDING", "embed_tokens.weight") in pairing_errors(report)


def test_one_changed_embedding_element_fails(tmp_path, draft, draft_tensors):
    embed = draft_tensors["embed_tokens.weight"].clone()
    embed[7, 3] += 1
    report = verify(draft, target=make_teacher(tmp_path / "t", embed))
    assert pairing_errors(report) == {("PAIRING_EMBEDDING", "embed_tokens.weight")}
    assert report.sections["pairing"]["embedding"]["identical"] is False


@pytest.mark.parametrize("last_tap, accepted", [(5, True), (6, False)])
def test_verify_pairing_and_rollouts_apply_one_tap_rule(tmp_path, draft_tensors, last_tap, accepted):
    # Before: [1, 3, 5] with 6 target layers passed verify and was refused by rollouts and finetune.
    from dspark_hub.errors import DsparkError
    from dspark_hub.train.data.draft_taps import check_target_matches

    config = tiny_config(target_layer_ids=[1, 3, last_tap])
    draft = write_checkpoint(tmp_path / "d", config=config, tensors=draft_tensors)
    teacher = make_teacher(tmp_path / "t", draft_tensors["embed_tokens.weight"])
    paired = verify(draft, target=teacher)
    teacher_config = json.loads((teacher / "config.json").read_text())
    try:
        check_target_matches(teacher_config, config)
        rollouts_accept = True
    except DsparkError:
        rollouts_accept = False
    assert (verify(draft).ok, paired.ok, rollouts_accept) == (accepted, accepted, accepted)
    if accepted:   # the final layer is a warning, said once
        said = [f for f in paired.findings if f.where == "config.json:target_layer_ids"]
        assert [(f.code, f.severity) for f in said] == [("CONFIG_RULE", "warning")]


@pytest.mark.parametrize("content,special,ok", [
    ("<|mask|>", True, True),
    ("<|reserved_token_509|>", False, True),
    ("hello", False, False),
])
def test_mask_token_must_be_special_or_reserved(tmp_path, draft, draft_tensors, content, special, ok):
    teacher = make_teacher(tmp_path / "t", draft_tensors["embed_tokens.weight"], mask_content=content,
                           mask_special=special)
    report = verify(draft, target=teacher)
    assert (("PAIRING_MASK_TOKEN", "config.json:mask_token_id") in pairing_errors(report)) is not ok


def test_mask_equal_to_target_pad_fails(tmp_path, draft, draft_tensors):
    teacher = make_teacher(tmp_path / "t", draft_tensors["embed_tokens.weight"],
                           config=teacher_config(pad_token_id=MASK), tokenizer=False)
    report = verify(draft, target=teacher)
    assert next(f.message for f in report.errors if f.code == "PAIRING_MASK_TOKEN").endswith(
        "training and serving then confuse the mask with real text")


def test_revision_from_hf_download_metadata_and_cli(tmp_path, draft, draft_tensors):
    teacher = make_teacher(tmp_path / "t", draft_tensors["embed_tokens.weight"])
    meta = teacher / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "config.json.metadata").write_text("a" * 40 + "\netag\n1700000000.0\n")
    result = CliRunner().invoke(cli, ["verify", str(draft), "--target", str(teacher), "--json"])
    assert result.exit_code == 0, result.output
    pairing = json.loads(result.stdout)["sections"]["pairing"]
    assert (pairing["revision"], pairing["revision_source"]) == ("a" * 40, "hf download --local-dir metadata")
    human = CliRunner().invoke(cli, ["verify", str(draft), "--target", str(teacher)])
    assert "embedding: bit-identical)" in human.stdout


def test_target_without_config_is_a_usage_error(tmp_path, draft):
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(cli, ["verify", str(draft), "--target", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "no readable config.json" in result.output


def test_remote_target_through_the_hub_source(tmp_path, draft, draft_tensors, hub, hub_repo_id, hub_token):
    from dspark_hub.format.remote import HubSource
    from dspark_hub.hub.publish import publish

    teacher = make_teacher(tmp_path / "t", draft_tensors["embed_tokens.weight"])
    result = publish(teacher, hub_repo_id, token=hub_token, endpoint=hub.url, private=True)
    assert result.ok, result.to_dict()
    source = HubSource.from_url(f"hf://{hub_repo_id}", endpoint=hub.url, token=hub_token)
    report = verify(draft, target=source)
    assert report.ok, [f.to_dict() for f in report.findings]
    pairing = report.sections["pairing"]
    assert pairing["revision_source"] == "hub" and len(pairing["revision"]) == 40
    assert pairing["embedding"]["identical"] is True
    assert pairing["files"]["model.safetensors"]["sha256"] == hashlib.sha256(
        (teacher / "model.safetensors").read_bytes()).hexdigest()


def test_an_f32_target_pairs_with_the_exact_bf16_rounding_of_its_embedding(tmp_path, draft_tensors):
    values = torch.randn(draft_tensors["embed_tokens.weight"].shape) * 0.02     # F32, as save_pretrained writes
    draft = write_checkpoint(tmp_path / "draft", tensors=dict(draft_tensors,
                                                                **{"embed_tokens.weight": values.to(torch.bfloat16)}))
    target = make_teacher(tmp_path / "teacher", values)
    report = verify(draft, target=target)
    assert report.ok, [f.to_dict() for f in report.findings]
    embedding = report.sections["pairing"]["embedding"]
    assert embedding["compared_as"] == "cast" and embedding["identical"] is True
    assert embedding["verdict"] == "identical after BF16 rounding (nearest even) of the F32 target"
    assert embedding["target"]["dtype"] == "F32" and embedding["target_cast"]["sha256"] == embedding["draft"]["sha256"]
    (ok,) = [f for f in report.findings if f.code == "PAIRING_OK"]
    assert "identical after BF16 rounding (nearest even) of the F32 target" in ok.message
    human = CliRunner().invoke(cli, ["verify", str(draft), "--target", str(target)])
    assert human.exit_code == 0 and "embedding: identical after BF16 rounding" in human.stdout
    truncated = values.view(torch.int32).bitwise_and(-65536).view(torch.float32).to(torch.bfloat16)   # not RNE
    assert not torch.equal(truncated, values.to(torch.bfloat16))
    wrong = write_checkpoint(tmp_path / "wrong", tensors=dict(draft_tensors, **{"embed_tokens.weight": truncated}))
    (finding,) = [f for f in verify(wrong, target=target).errors if f.code == "PAIRING_EMBEDDING"]
    assert "identical to the BF16 rounding (nearest even) of the target's" in finding.message
