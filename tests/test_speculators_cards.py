"""Cards and publish for a speculators DSpark: facts computed through the format registry, the gate is its verify."""

from __future__ import annotations

import shutil

import pytest
import yaml
from click.testing import CliRunner

from dspark_hub.cards.lint import lint_card
from dspark_hub.cards.render import card_facts, render_card
from dspark_hub.cli.main import cli
from dspark_hub.hub.release import publish_checkpoint

from .card_fixtures import SPECULATOR
from .spec_fixtures import copy_fixture, edit_tensors, fixture, rename

FRONT = {"license": "apache-2.0", "base_model": "org/verifier", "tags": ["dspark", "speculators"],
         "pipeline_tag": "text-generation"}


@pytest.fixture
def tiny_card(tmp_path):
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({
        "name": "Tiny speculator", "front_matter": FRONT,
        "usage": "vllm serve VERIFIER --spec-method dspark --spec-model DRAFT --spec-tokens {{ facts.block_size }}"}))
    return meta


@pytest.fixture
def carded(tmp_path, tiny_card):
    folder = copy_fixture(tmp_path, "dspark-pruned-vocab", "ckpt")
    (folder / "README.md").write_text(render_card(tiny_card, folder))
    return folder


def test_facts_come_from_the_speculators_format():
    facts = card_facts(fixture("dspark-pruned-vocab"), hash_files=False)
    assert facts.format == "speculators_dspark" and facts.model_type is None
    assert facts.parameters.to_dict() == {"total": 95_825, "trained": 91_729, "frozen": 4_096, "maps": 320}
    assert facts.target_layer_ids == [1, 3, 5]               # as the config writes them (aux ids)
    assert facts.block_size == 4                             # a speculators config key
    assert facts.num_layers == 2 and facts.tensor_count == 32 and facts.dtype == "bfloat16"
    assert facts.has_embed_tokens is False and "verifier's rows" in facts.frozen_note
    sharded = card_facts(fixture("dspark-sharded"), hash_files=False)
    assert sharded.parameters.total == 94_801 and [c.file for c in sharded.checksums][-1].endswith(".index.json")


def test_card_block_size_may_not_contradict_the_config(tmp_path):
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "x", "front_matter": FRONT, "architecture": {"block_size": 8}}))
    from dspark_hub.errors import UsageError

    with pytest.raises(UsageError, match=r"config\.json block_size 4"):
        render_card(meta, fixture("dspark"))


def test_the_speculator_card_renders_from_a_speculators_checkpoint(tmp_path):
    text = render_card(SPECULATOR / "card.yaml", fixture("dspark-pruned-vocab"), hash_files=False)
    assert "95,825 parameters in bfloat16 across 32 tensors" in text
    assert "`lm_head` holds the verifier's rows for the pruned draft vocabulary and is frozen, so only 91,729" in text
    assert "There is no `embed_tokens` (the teacher's is used)." in text
    assert "| `markov_head.markov_w2.weight` | 64 x 16 |" in text and "| Parameters | 95,825 |" in text
    assert "speculators aux ids: id k is the residual stream after k teacher layers" in text
    readme = tmp_path / "README.md"
    readme.write_text(text)
    codes = {(f.code, f.severity) for f in lint_card(readme, fixture("dspark-pruned-vocab")).findings}
    # the card's typed training facts are the real K3 draft's, so lint (reading speculators facts) names them
    assert ("TARGET_LAYERS_MISMATCH", "error") in codes and ("BLOCK_SIZE_MISMATCH", "error") in codes
    assert not {c for c, _ in codes} & {"PARAMETERS_MISMATCH", "TENSOR_COUNT_MISMATCH", "SHAPE_MISMATCH",
                                       "LAYER_COUNT_MISMATCH"}


def test_a_card_rendered_from_the_weights_lints_clean_against_them(carded):
    report = lint_card(carded / "README.md", carded)
    assert report.ok, [f.to_dict() for f in report.findings]
    assert "--spec-tokens 4" in (carded / "README.md").read_text()


def test_config_only_card_facts_for_a_speculators_config(tmp_path):
    meta = tmp_path / "card.yaml"
    shutil.copy(fixture("dspark") / "config.json", tmp_path / "draft-config.json")
    meta.write_text(yaml.safe_dump({"name": "x", "front_matter": FRONT,
                                    "architecture": {"config": "draft-config.json"}}))
    text = render_card(meta)
    assert "94,801 parameters in BF16 across 29 tensors" in text or "94,801 parameters in bfloat16" in text


def test_publish_gates_with_the_speculators_verify(carded, hub, hub_repo_id):
    ok = publish_checkpoint(carded, hub_repo_id, endpoint=hub.url, dry_run=True)
    assert ok.gate.ok and ok.ok, ok.gate.refusals
    assert ok.gate.verify.summary.format == "speculators_dspark"
    edit_tensors(carded, rename("fc.weight", "context_proj.weight"))
    refused = publish_checkpoint(carded, hub_repo_id, endpoint=hub.url, dry_run=True)
    assert not refused.ok and any("context_proj.weight" in r for r in refused.gate.refusals)


def test_publish_with_k3_remote_code_is_refused_for_a_speculators_checkpoint(carded, hub, hub_repo_id):
    result = publish_checkpoint(carded, hub_repo_id, endpoint=hub.url, dry_run=True, with_remote_code=True)
    assert not result.ok
    assert any("speculators" in r and "remote code" in r for r in result.gate.refusals)


def test_cli_card_and_publish_dry_run(carded, tiny_card, tmp_path, hub, hub_repo_id):
    out = tmp_path / "card.md"
    result = CliRunner().invoke(cli, ["card", str(carded), "--meta", str(tiny_card), "-o", str(out), "--no-hash"])
    assert result.exit_code == 0, result.output
    dry = CliRunner().invoke(cli, ["publish", str(carded), hub_repo_id, "--endpoint", hub.url, "--dry-run"])
    assert dry.exit_code == 0, dry.output
