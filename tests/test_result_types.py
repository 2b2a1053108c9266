"""The hub and golden commands' `--json` documents against their declarations, the result dataclasses
(`checksums`, `checksums --check`, `package`, `publish`, `golden`, `golden check`; `documents.document_type`), as
tests/test_report_sections.py checks the verify report: every run's document has exactly the declared keys, and
between them the runs write every key the declarations name.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import save_file

from dspark_hub.cards.render import render_card
from dspark_hub.cli.main import cli
from dspark_hub.format import contract
from dspark_hub.hub.checksums import ChecksumCheck, ChecksumFiles
from dspark_hub.hub.package import PackageResult
from dspark_hub.hub.release import Publication
from dspark_hub.verify.golden import GoldenCheck, GoldenWrite

from .factories import write_checkpoint
from .test_publish import FRONT
from .test_report_sections import Seen, declared, mismatches


def run_json(*args: Any, token: str | None = None) -> dict[str, Any]:
    result = CliRunner(env={"HF_TOKEN": token} if token else None).invoke(cli, [*map(str, args), "--json"])
    assert result.exit_code in (0, 1), result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


@pytest.fixture(scope="module")
def documents(tmp_path_factory, hub_server) -> dict[str, tuple[Any, dict[str, Any]]]:
    """run name -> (the document's type, the document): each command on a clean folder and on one that differs
    (checksums), and publish dry, published, unchanged, through LFS to a branch, and refused by the gate
    (no card; a config verify refuses)."""
    tmp = tmp_path_factory.mktemp("hub-documents")
    plain = write_checkpoint(tmp / "plain")
    out: dict[str, tuple[Any, dict[str, Any]]] = {
        "checksums": (ChecksumFiles, run_json("checksums", plain)),
        "checksums --check, clean": (ChecksumCheck, run_json("checksums", plain, "--check")),
        "package": (PackageResult, run_json("package", plain, "--repo", "org/tiny", "-o", tmp / "package"))}
    (plain / contract.CONFIG_NAME).write_text((plain / contract.CONFIG_NAME).read_text() + " ")
    (plain / "extra.txt").write_text("not in the sidecars")
    out["checksums --check, differs"] = (ChecksumCheck, run_json("checksums", plain, "--check"))
    carded = write_checkpoint(tmp / "carded")
    meta = tmp / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2}}))
    (carded / "README.md").write_text(render_card(meta, carded))
    repo = f"{hub_server.user}/documents-{uuid.uuid4().hex[:10]}"

    def publish(folder: Any, *extra: Any) -> tuple[Any, dict[str, Any]]:
        return Publication, run_json("publish", folder, repo, "--endpoint", hub_server.url, *extra,
                                         token=hub_server.token)

    out["publish --dry-run"] = publish(carded, "--dry-run")
    out["publish"] = publish(carded, "--tag", "v1")
    out["publish, unchanged"] = publish(carded)
    out["publish --transfer lfs --revision dev"] = publish(carded, "--transfer", "lfs", "--revision", "dev")
    out["publish, refused (no card)"] = publish(tmp / "plain")
    config = json.loads((carded / contract.CONFIG_NAME).read_text())
    (carded / contract.CONFIG_NAME).write_text(json.dumps({**config, "rope_interleave": True}))
    out["publish, refused (verify findings)"] = publish(carded)
    out.update(golden_documents(tmp))
    return out


def golden_documents(tmp: Any) -> dict[str, tuple[Any, dict[str, Any]]]:
    """golden with the stand-in and with an lm_head file; golden check passing, and on a fixture one of whose
    stored outputs has another shape (a comparison that cannot be made says why)."""
    ckpt = write_checkpoint(tmp / "golden-ckpt")
    head = tmp / "head.safetensors"
    config = contract.TINY_CONFIG
    save_file({"lm_head.weight": torch.randn(config["draft_vocab_size"], config["hidden_size"])}, str(head))
    standin, with_file, reshaped = tmp / "standin.safetensors", tmp / "file.safetensors", tmp / "reshaped.safetensors"
    out = {"golden": (GoldenWrite, run_json("golden", ckpt, "-o", standin)),
           "golden --lm-head": (GoldenWrite, run_json("golden", ckpt, "-o", with_file, "--lm-head", head)),
           "golden check": (GoldenCheck, run_json("golden", "check", ckpt, standin))}
    with safe_open(str(standin), framework="pt") as handle:
        metadata = handle.metadata()
        names = handle.keys()
        tensors = {name: handle.get_tensor(name) for name in names}
    tensors["short.last_hidden_state"] = tensors["short.last_hidden_state"][:1].contiguous()
    save_file(tensors, str(reshaped), metadata=metadata)
    out["golden check, reshaped output"] = (GoldenCheck, run_json("golden", "check", ckpt, reshaped))
    return out


def test_every_document_has_exactly_the_typed_keys(documents):
    found = {name: problems for name, (tp, doc) in documents.items() if (problems := mismatches(tp, doc))}
    assert found == {}


def test_every_declared_key_is_written_by_some_run(documents):
    seen: Seen = set()
    expected: Seen = set()
    for tp, doc in documents.values():
        mismatches(tp, doc, seen=seen)
        declared(tp, expected)
    assert expected - seen == set()


def test_the_runs_cover_each_publish_status_both_check_outcomes_and_both_lm_heads(documents):
    statuses = {doc["status"] for tp, doc in documents.values() if tp is Publication}
    assert statuses == {"dry_run", "published", "unchanged", "refused"}
    checks = [doc for tp, doc in documents.values() if tp is ChecksumCheck]
    assert {doc["ok"] for doc in checks} == {True, False}
    assert {p["kind"] for doc in checks for p in doc["problems"]} >= {"mismatch", "extra"}
    assert {doc["lm_head"]["kind"] for tp, doc in documents.values() if tp is GoldenWrite} == {
        "file", "seeded-standin"}
    assert {doc["ok"] for tp, doc in documents.values() if tp is GoldenCheck} == {True, False}


@pytest.mark.parametrize("tp, change, expected", [
    (ChecksumFiles, lambda d: d.pop("sums_path"), ["$.sums_path: missing"]),
    (ChecksumFiles, lambda d: d.update(schema_version=1), ["$.schema_version: not in ChecksumFilesDocument"]),
    (Publication, lambda d: d["gate"].update(extra=1), ["$.gate.extra: not in GateDocument"]),
    (Publication, lambda d: d.update(status="uploaded"), [
        "$.status: 'uploaded' is not one of ['refused', 'dry_run', 'published', 'unchanged']"]),
    (GoldenWrite, lambda d: d["lm_head"].update(kind="file"), [      # the stand-in's keys under the file's kind
        "$.lm_head.kind: 'file' is not one of ['seeded-standin']"]),
])
def test_a_document_out_of_shape_is_named(documents, tp, change, expected):
    doc = json.loads(json.dumps(next(doc for t, doc in documents.values() if t is tp)))
    change(doc)
    assert mismatches(tp, doc) == expected
