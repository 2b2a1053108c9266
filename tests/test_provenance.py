"""What gets published names checkpoints by Hub id or digest, never by a local path."""

from __future__ import annotations

import hashlib
import json

import pytest

from dspark_hub.format.provenance import describe, identify, is_hub_id, public_args

from .factories import file_digest, write_checkpoint


def test_identify_a_snapshot_a_file_and_a_folder(tmp_path):
    snapshot = tmp_path / "hub" / "models--org--teacher" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    assert identify(snapshot) == {"hub": f"org/teacher@{'a' * 40}"}
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "hi"}\n')
    assert identify(prompts) == {"sha256": hashlib.sha256(prompts.read_bytes()).hexdigest()}
    base = write_checkpoint(tmp_path / "base")
    assert identify(base) == {"sha256": {"config.json": file_digest(base / "config.json"),
                                         "model.safetensors": file_digest(base / "model.safetensors")}}
    assert identify(base, weights=False) == {"sha256": {"config.json": file_digest(base / "config.json")}}
    assert identify(tmp_path / "nope") is None


@pytest.mark.parametrize("text, hub", [("org/name", True), ("org/name@main", True), ("./base", False),
                                       ("teacher", False), ("/home/me/base", False), ("../x/y", False)])
def test_hub_ids_are_told_from_paths(text, hub):
    assert is_hub_id(text) is hub


def test_public_args_replace_every_path_and_keep_the_rest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = write_checkpoint(tmp_path / "base")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    args = {"base": "./base", "data": "data", "teacher": "org/teacher", "out": "./tuned", "state_dir": None,
            "lr": 3e-4, "prompts": None}
    public = public_args(args, ("base", "data", "teacher", "prompts"), drop=("out", "state_dir"), weights=("base",))
    assert public == {"base": {"sha256": {"config.json": file_digest(base / "config.json"),
                                          "model.safetensors": file_digest(base / "model.safetensors")}},
                      "data": {"sha256": {"manifest.json": file_digest(tmp_path / "data" / "manifest.json")}},
                      "teacher": {"hub": "org/teacher"}, "lr": 3e-4, "prompts": None}
    assert "./" not in json.dumps(public) and str(tmp_path) not in json.dumps(public)


def test_training_args_name_no_local_path(tmp_path, monkeypatch):
    from dspark_hub.train.finetuning.trainer import TrainConfig

    monkeypatch.chdir(tmp_path)
    write_checkpoint(tmp_path / "base")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text("{}")
    doc = TrainConfig(base="./base", out="./tuned", data="./data", target="teacher").public_dict()
    assert set(doc) >= {"base", "data", "teacher", "lr", "steps"} and "out" not in doc and "state_dir" not in doc
    assert describe(doc["base"]).startswith("sha256 config.json ")
    assert doc["teacher"] is None           # a path that is not there: nothing to name, and no path
    assert "./" not in json.dumps(doc) and str(tmp_path) not in json.dumps(doc)


def test_describe_names_identities_and_nothing_else():
    assert describe({"hub": "org/x@abc"}) == "org/x@abc"
    assert describe({"sha256": {"config.json": "ab" * 32}}) == f"sha256 config.json {'ab' * 6}"
    assert describe("./base") is None and describe("org/x") == "org/x"
