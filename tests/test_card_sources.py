"""Card inputs a user gives: a finetune log renders, no local path reaches a card, card.yaml is checked by key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dspark_hub.cards.render import render_card
from dspark_hub.cards.source import CARD_KEYS, card_source_problems
from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError

FRONT = {"license": "apache-2.0", "base_model": "org/teacher", "base_model_relation": "finetune",
         "tags": ["dspark"], "pipeline_tag": "text-generation"}


def _meta(folder: Path, **sections) -> Path:
    path = folder / "card.yaml"
    path.write_text(yaml.safe_dump({"name": "Tiny-Draft", "front_matter": FRONT, **sections}, sort_keys=False))
    return path


def _finetune_output(folder: Path, args: dict) -> Path:
    """What finetune leaves beside the weights: training_log.jsonl and training_args.json."""
    folder.mkdir(parents=True, exist_ok=True)
    steps = [{"step": s, "loss": 3.0 - s / 10, "ce": 4.0 - s / 10, "tv": 0.9, "lr": 1e-3 * s / 4, "grad_norm": 1.0,
              "accuracy": 0.1 * s, "overlap": 0.2, "tokens": 100} for s in range(1, 5)]
    log = folder / "training_log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in steps))
    (folder / "training_args.json").write_text(json.dumps(args))
    return log


def test_a_finetune_log_renders_the_training_section(tiny, tmp_path):
    sha = "ab" * 32
    log = _finetune_output(tmp_path / "run", {"base": {"sha256": {"config.json": sha, "model.safetensors": sha}},
                                              "teacher": {"hub": "org/teacher@0123abc"}, "data": None, "lr": 1e-3,
                                              "steps": 4, "loss": {"ce": 0.1, "tv": 0.9}, "on_policy": False,
                                              "rounds": 1})
    out = tmp_path / "README.md"
    result = CliRunner().invoke(cli, ["card", str(tiny), "--meta", str(_meta(tmp_path)), "--train-log", str(log),
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    card = out.read_text()
    assert "The training setup is not documented" not in card
    assert "The training log records 4 optimizer steps (1 to 4) over 400 tokens" in card
    assert "loss (ce, tv) 2.9000 at step 1, 2.6000 at step 4" in card
    assert "| Teacher | org/teacher@0123abc |" in card and f"| Base draft | sha256 config.json {sha[:12]}" in card
    assert '| Loss weights | {"ce": 0.1, "tv": 0.9} |' in card and "Rounds" not in card


@pytest.mark.parametrize("older", ["./base", "toy/base"])
def test_no_local_path_from_an_older_log_or_eval_reaches_the_card(tiny, tmp_path, older):
    log = _finetune_output(tmp_path / "run", {"base": "./base", "teacher": "teacher", "data": "/home/me/data",
                                              "lr": 1e-3})
    evaluation = tmp_path / "eval.json"
    evaluation.write_text(json.dumps({
        "acceptance_length": 1.5, "per_position": [0.3, 0.2],
        "harness": {"mode": "teacher-forced", "teacher": "teacher (sha256 config.json 1a2b3c4d5e6f)",
                    "teacher_identity": {"path": "teacher", "repo": None, "revision": None,
                                         "digests": {"config.json": "1a2b3c4d5e6f" + "0" * 52},
                                         "label": "teacher (sha256 config.json 1a2b3c4d5e6f)"},
                    "data": "/home/me/heldout",
                    "reference": f"{older} (acceptance length 1.2000; ratio 1.2500)"}}))
    card = render_card(_meta(tmp_path), tiny, eval_json=evaluation, train_log=log)
    for leak in (older, "/home/me", "teacher (", "| teacher |"):
        assert leak not in card, leak
    assert "teacher: sha256 config.json 1a2b3c4d5e6f" in card
    assert "reference: a local draft (acceptance length 1.2000; ratio 1.2500)" in card
    assert "| Learning rate | 0.001 |" in card and "Base draft" not in card


@pytest.mark.parametrize("doc, named", [
    ({"trainng": {"intro": "x"}}, "trainng: not a card key"),
    ({"training": {"setup": "lr 1e-3"}}, "training.setup: must be a list of [label, value] pairs"),
    ({"training": {"setup": [["Steps", 4], ["Oops"]]}}, "training.setup[1] must be a [label, value] pair"),
    ({"architecture": {"block_size": "7"}}, "architecture.block_size: must be an integer"),
    ({"results": {"by_dataset": {"rate_decimals": 1.5}}}, "results.by_dataset.rate_decimals: must be an integer"),
    ({"results": {"by_step": {"intro": "x", "footer": "y"}}}, "results.by_step.footer: not a card key here"),
    ({"checksums": {"files": [{"file": "a", "size": "1"}]}}, "checksums.files[0] must be {file: string"),
    ({"name": None}, "name: must be a string"),
])
def test_card_yaml_errors_name_the_key(tmp_path, doc, named):
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "T", "front_matter": FRONT, **doc}))
    with pytest.raises(UsageError, match=None) as caught:
        render_card(meta)
    assert named in str(caught.value), str(caught.value)
    result = CliRunner().invoke(cli, ["card", "--meta", str(meta), "-o", str(tmp_path / "R.md")])
    assert result.exit_code == 2 and named in result.stderr


def test_missing_required_keys_are_named():
    assert card_source_problems({"summary": "x"}) == ["name: is required", "front_matter: is required"]


def test_the_committed_card_sources_follow_the_schema():
    root = Path(__file__).resolve().parent.parent / "cards"
    for source in sorted(root.glob("*/card.yaml")):
        assert card_source_problems(yaml.safe_load(source.read_text())) == [], source
    assert all(kind in {"string", "markdown", "integer", "mapping", "names", "pairs", "config", "files"}
               for kind, _ in CARD_KEYS.values())


def test_a_hand_written_teacher_is_a_hub_id_only_when_no_such_folder_exists(tmp_path, monkeypatch):
    from dspark_hub.cards.results import public_text

    monkeypatch.chdir(tmp_path)
    assert public_text("teacher", "moonshotai/Kimi-K3") == "moonshotai/Kimi-K3"
    (tmp_path / "toy" / "teacher").mkdir(parents=True)
    assert public_text("teacher", "toy/teacher") == "a local folder"
    assert public_text("reference", "org/draft (acceptance length 1.5000; ratio 1.1000)") == \
        "a local draft (acceptance length 1.5000; ratio 1.1000)"
    assert public_text("reference", "org/draft@0123abc (acceptance length 1.5000; ratio 1.1000)") == \
        "org/draft@0123abc (acceptance length 1.5000; ratio 1.1000)"
