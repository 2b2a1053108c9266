"""`publish` through Xet or LFS, with Xet on in the client (hf_xet installed, as for users), against the local Hub,
which answers the Xet token routes as an endpoint without Xet does (404); and `publish` without a token."""

from __future__ import annotations

import json
import logging

import pytest

from dspark_hub.hub.publish import TransferChoice, choose_transfer

from . import test_publish
from .cli_errors import assert_one_line_error

run = test_publish.run
carded = test_publish.carded     # the fixture: a tiny checkpoint with its card, which passes the gate


@pytest.fixture
def client_without_xet(monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


def weights_sha256(folder):
    import hashlib
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_default_publish_falls_back_to_lfs_on_an_endpoint_without_xet(hub, hub_repo_id, hub_token, carded):
    from huggingface_hub import constants
    assert constants.HF_HUB_DISABLE_XET is False     # the path users take
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--json", env={"HF_TOKEN": hub_token})
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)["publish"]
    assert doc["status"] == "published" and doc["problems"] == []
    assert doc["transfer"]["name"] == "lfs" and "404" in doc["transfer"]["reason"]
    assert ("write", hub_repo_id, "main") in hub.xet_token_requests    # it asked, as the Xet upload would
    assert hub.lfs_uploaded_oids(hub_repo_id) == [weights_sha256(carded)]
    assert hub.head_files(hub_repo_id)["model.safetensors"].lfs_oid == weights_sha256(carded)
    assert constants.HF_HUB_DISABLE_XET is False     # the client's switch is put back


def test_default_publish_says_which_transfer_it_used(hub, hub_repo_id, hub_token, carded):
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, env={"HF_TOKEN": hub_token})
    assert result.exit_code == 0, result.output
    assert "uploaded through LFS (the endpoint has no Xet storage" in result.stdout
    assert "--transfer" in result.stdout


def test_forced_xet_on_an_endpoint_without_it_names_xet_and_the_fix_not_the_network(hub, hub_repo_id, hub_token,
                                                                                     carded):
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--transfer", "xet",
                 env={"HF_TOKEN": hub_token})
    line = assert_one_line_error(result)
    assert "no Xet storage" in line and "404" in line
    assert "--transfer lfs" in line and "HF_HUB_DISABLE_XET=1" in line
    assert "network" not in line and "cannot reach" not in line
    assert hub.lfs_uploaded_oids(hub_repo_id) == []
    assert set(hub.head_files(hub_repo_id)) == {".gitattributes"}      # nothing committed


def test_forced_lfs_does_not_ask_for_xet(hub, hub_repo_id, hub_token, carded):
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--transfer", "lfs", "--json",
                 env={"HF_TOKEN": hub_token})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["publish"]["transfer"] == {"name": "lfs", "reason": "LFS was asked for"}
    assert not [r for r in hub.xet_token_requests if r[1] == hub_repo_id]


def test_a_client_without_xet_takes_lfs_without_asking(hub, hub_repo_id, hub_token, carded, client_without_xet):
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--json", env={"HF_TOKEN": hub_token})
    assert result.exit_code == 0, result.output
    transfer = json.loads(result.stdout)["publish"]["transfer"]
    assert transfer["name"] == "lfs" and "HF_HUB_DISABLE_XET" in transfer["reason"]
    assert not [r for r in hub.xet_token_requests if r[1] == hub_repo_id]


def test_forced_xet_in_a_client_without_it_is_a_usage_error(hub, hub_repo_id, hub_token, carded,
                                                             client_without_xet):
    requests = len(hub.requests)
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url, "--transfer", "xet",
                 env={"HF_TOKEN": hub_token})
    line = assert_one_line_error(result)
    assert "--transfer" in line and "hf-xet" in line
    assert len(hub.requests) == requests


@pytest.mark.parametrize(("requested", "client", "endpoint", "expected"), [
    ("auto", True, True, "xet"),
    ("auto", True, False, "lfs"),
    ("auto", False, True, "lfs"),
    ("lfs", True, True, "lfs"),
    ("xet", True, False, "xet"),
])
def test_choose_transfer(requested, client, endpoint, expected):
    asked = []

    def probe():
        asked.append(1)
        return endpoint
    choice = choose_transfer(requested, client, probe)
    assert isinstance(choice, TransferChoice) and choice.name == expected
    assert bool(asked) == (requested == "auto" and client)   # the endpoint is asked only when it decides


def test_publish_without_a_token_says_none_was_found_and_where_it_is_read(hub, hub_repo_id, carded):
    from huggingface_hub import constants
    requests = len(hub.requests)
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url)
    line = assert_one_line_error(result)
    assert "no Hub token found" in line and "HF_TOKEN" in line and constants.HF_TOKEN_PATH in line
    assert "401" not in line and "rejected" not in line
    assert len(hub.requests) == requests        # refused before any request


def test_a_token_in_the_login_file_is_found(hub, hub_repo_id, hub_token, carded, monkeypatch, tmp_path):
    from huggingface_hub import constants
    token_file = tmp_path / "token"
    token_file.write_text(hub_token)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(token_file))
    result = run("publish", carded, hub_repo_id, "--endpoint", hub.url)
    assert result.exit_code == 0, result.output


@pytest.fixture
def hub_log():
    """Every record that reaches huggingface_hub's own handler (its logger does not propagate)."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    handler = Keep()
    logging.getLogger("huggingface_hub").addHandler(handler)
    yield records
    logging.getLogger("huggingface_hub").removeHandler(handler)


def test_republishing_is_unchanged_without_the_clients_no_op_warning(hub, hub_repo_id, hub_token, carded, hub_log):
    first = run("publish", carded, hub_repo_id, "--endpoint", hub.url, env={"HF_TOKEN": hub_token})
    assert first.exit_code == 0, first.output
    again = run("publish", carded, hub_repo_id, "--endpoint", hub.url, env={"HF_TOKEN": hub_token})
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("unchanged:") or "\nunchanged:" in again.stdout
    assert not [m for m in hub_log if "No files have been modified" in m]
    logging.getLogger("huggingface_hub.hf_api").warning("No files have been modified since last commit. x")
    assert hub_log, "the capture itself works outside publish"
