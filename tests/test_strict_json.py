"""Every JSON dspark-hub reads goes through `format.jsonio`: a repeated key is refused everywhere."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from dspark_hub.errors import UsageError
from dspark_hub.format import contract

ROOT = Path(__file__).resolve().parent.parent
DUPLICATE = '{"a": 1, "a": 2}'


def test_no_module_parses_json_with_the_lenient_stdlib_loader():
    """`json.loads`/`json.load` keep the last repeated key; only `jsonio` may call them (strictly)."""
    found = []
    for path in sorted((ROOT / "dspark_hub").rglob("*.py")):
        if path.relative_to(ROOT).as_posix() == "dspark_hub/format/jsonio.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr in ("load", "loads")
                    and isinstance(node.value, ast.Name) and node.value.id == "json"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.module == "json" and \
                    {a.name for a in node.names} & {"load", "loads"}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "use dspark_hub.format.jsonio (loads_strict, load_json_file, load_json_object)"


def _config_with_duplicate(tmp_path: Path) -> Path:
    text = contract.config_bytes(contract.TINY_CONFIG).decode()
    path = tmp_path / "config.json"
    path.write_text(text.replace('"hidden_size": 64', '"hidden_size": 64, "hidden_size": 64'))
    return path


def test_card_config_reference_refuses_a_repeated_key(tmp_path):
    from dspark_hub.cards.facts import _load_config

    _config_with_duplicate(tmp_path)
    with pytest.raises(UsageError, match=r"config.json: cannot read the config named by architecture.config "
                                         r"\(key 'hidden_size' appears twice"):
        _load_config("config.json", tmp_path)


def test_eval_json_and_train_log_refuse_a_repeated_key(tmp_path):
    from dspark_hub.cards.results import load_eval, load_train_log

    (tmp_path / "eval.json").write_text(DUPLICATE)
    with pytest.raises(UsageError, match=r"eval.json: key 'a' appears twice.*pass the output of 'dspark-hub eval"):
        load_eval(tmp_path / "eval.json")
    (tmp_path / "log.jsonl").write_text('{"step": 1}\n{"step": 2, "step": 3}\n')
    with pytest.raises(UsageError, match=r"log.jsonl:2: key 'step' appears twice"):
        load_train_log(tmp_path / "log.jsonl")


def test_teacher_and_draft_configs_refuse_a_repeated_key(tmp_path):
    from dspark_hub.format.jsonio import read_json_input

    path = _config_with_duplicate(tmp_path)
    with pytest.raises(UsageError, match=r"config.json: key 'hidden_size' appears twice.*; pass the draft"):
        read_json_input(path, what="the draft's config.json file")


def test_rollouts_manifest_and_prompts_refuse_a_repeated_key(tmp_path):
    from dspark_hub.train.data.rollouts import RolloutData, read_prompts

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text('{"schema": "x", "schema": "y"}')
    with pytest.raises(UsageError, match=r"manifest.json: key 'schema' appears twice"):
        RolloutData(tmp_path / "data")
    (tmp_path / "p.jsonl").write_text('{"input_ids": [1, 2], "input_ids": [3]}\n')
    with pytest.raises(UsageError, match=r"p.jsonl:1: key 'input_ids' appears twice"):
        read_prompts(tmp_path / "p.jsonl")


def test_loss_weights_refuse_a_repeated_term():
    from dspark_hub.train.finetuning.objective import parse_loss

    with pytest.raises(UsageError, match=r"^loss: key 'ce' appears twice"):
        parse_loss(json.dumps({"ce": 1.0})[:-1] + ', "ce": 0.5}')


def test_pairing_ignores_a_tokenizer_file_with_a_repeated_key(tmp_path):
    from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
    from dspark_hub.verify.pairing import _read_json

    (tmp_path / "tokenizer_config.json").write_text('{"added_tokens_decoder": {}, "added_tokens_decoder": {}}')
    (tmp_path / "special_tokens_map.json").write_text('{"mask_token": "<m>"}')
    view = open_checkpoint(LocalSource(tmp_path))
    assert _read_json(view, "tokenizer_config.json") is None
    assert _read_json(view, "special_tokens_map.json") == {"mask_token": "<m>"}     # the passing twin
