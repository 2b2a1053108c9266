"""No token huggingface_hub sends is ever printed: from HF_TOKEN, HF_TOKEN_PATH or $HF_HOME/token, in human,
--json and --debug output, for `verify hf://` and `publish`.

The local Hub server is made to echo the Authorization header in every error body (a proxy or a debug
endpoint that does so is the real-world leak). Each command runs in its own process, so huggingface_hub
resolves the token the way it does for a user (it reads HF_HOME and HF_TOKEN_PATH when imported).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.hub_server import HttpError, HubServer

from .factories import write_checkpoint

FRONT = {"license": "apache-2.0", "base_model": "org/teacher", "tags": ["dspark"], "pipeline_tag": "text-generation"}
SOURCES = ("token_file", "hf_token_path", "hf_token")
MODES = ("human", "json", "debug")


@pytest.fixture(scope="module")
def echoing_hub():
    """A local Hub server that answers every request 400, quoting the request's Authorization header."""
    server = HubServer()
    seen: list[str] = []

    class Echo(server.httpd.RequestHandlerClass):   # type: ignore[name-defined,misc]
        def _route(self) -> int:
            header = self.headers.get("Authorization", "")
            seen.append(header)
            raise HttpError(400, f"bad request {self.path.split('?')[0]}; you sent Authorization: {header}")

    server.httpd.RequestHandlerClass = Echo
    server.seen = seen
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def carded(tmp_path_factory):
    """A tiny checkpoint with its card: passes the publish gate, so publish reaches the Hub."""
    from dspark_hub.cards.render import render_card

    root = tmp_path_factory.mktemp("carded")
    folder = write_checkpoint(root / "ckpt")
    meta = root / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2}}))
    (folder / "README.md").write_text(render_card(meta, folder))
    return folder


def _environment(tmp_path: Path, source: str, secret: str, endpoint: str) -> dict[str, str]:
    """A user's environment whose only token is `secret`, held where `source` says."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH")}
    home = tmp_path / "hf-home"
    home.mkdir()
    env.update(HF_HOME=str(home), HF_ENDPOINT=endpoint, COLUMNS="200", NO_COLOR="1")
    if source == "token_file":               # what `hf auth login` writes
        (home / "token").write_text(secret)
    elif source == "hf_token_path":
        elsewhere = tmp_path / "secrets" / "hub-token"
        elsewhere.parent.mkdir()
        elsewhere.write_text(secret + "\n")
        env["HF_TOKEN_PATH"] = str(elsewhere)
    else:
        env["HF_TOKEN"] = secret
    return env


def _run(args: list[str], mode: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    head = ["--debug"] if mode == "debug" else []
    tail = ["--json"] if mode == "json" else []
    return subprocess.run([sys.executable, "-m", "dspark_hub", *head, *args, *tail], capture_output=True, text=True,
                          env=env, timeout=300)


def _assert_redacted(out: subprocess.CompletedProcess[str], secret: str, hub: HubServer, mode: str) -> None:
    assert f"Bearer {secret}" in hub.seen, "the token was not sent: the test would prove nothing"
    printed = out.stdout + out.stderr
    assert secret not in printed, printed
    assert "you sent Authorization: Bearer <token>" in printed, printed    # the echo arrived, redacted
    assert "bad request /api/" in printed                                 # the rest of the message is kept
    if mode == "json":
        doc = json.loads(out.stdout)
        assert doc["ok"] is False and "<token>" in doc["error"]["message"]
    if mode == "debug":
        assert out.returncode == 1 and "Traceback (most recent call last)" in out.stderr
    else:
        assert out.returncode == 2 and "Traceback" not in printed


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source", SOURCES)
def test_verify_hf_never_prints_the_token(echoing_hub, tmp_path, source, mode):
    secret = f"hf_{secrets.token_hex(12)}"
    env = _environment(tmp_path, source, secret, echoing_hub.url)
    out = _run(["verify", "hf://org/draft", "--endpoint", echoing_hub.url], mode, env)
    _assert_redacted(out, secret, echoing_hub, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("source", SOURCES)
def test_publish_never_prints_the_token(echoing_hub, carded, tmp_path, source, mode):
    secret = f"hf_{secrets.token_hex(12)}"
    env = _environment(tmp_path, source, secret, echoing_hub.url)
    out = _run(["publish", str(carded), "org/draft", "--endpoint", echoing_hub.url, "-q"], mode, env)
    _assert_redacted(out, secret, echoing_hub, mode)


def test_a_stored_token_is_redacted_too(tmp_path, monkeypatch):
    """`hf auth login` keeps every token it saved; none is printed even when it is not the active one."""
    script = ("from dspark_hub.format.remote import redact_tokens; import huggingface_hub; "
              "print(redact_tokens('a hf_stored_one_0123 b hf_active_0123 c'))")
    home = tmp_path / "home"
    home.mkdir()
    (home / "stored_tokens").write_text("[old]\nhf_token = hf_stored_one_0123\n")
    env = {**os.environ, "HF_HOME": str(home), "HF_TOKEN": "hf_active_0123"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "a <token> b <token> c"


def test_text_without_a_token_is_left_alone(tmp_path):
    """The passing twin: with no token anywhere, nothing is replaced, even where huggingface_hub is loaded."""
    script = ("from dspark_hub.format.remote import redact_tokens; import huggingface_hub; "
              "print(redact_tokens('Bearer hf_not_a_known_token'))")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_TOKEN_PATH")} | {"HF_HOME": str(home)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "Bearer hf_not_a_known_token"
