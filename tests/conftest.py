"""Shared test set-up: deterministic CLI output, hypothesis budget, and the local Hub server."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


VLLM_MISSING = importlib.util.find_spec("vllm") is None
VLLM_SKIP = "vllm is not importable here; run the engine tests with: $(.ci/venv-vllm.sh) -m pytest -m vllm"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without vllm, every `vllm` test is skipped by one mark, which pytest's summary folds into one line a file."""
    if VLLM_MISSING:
        skip = pytest.mark.skip(reason=VLLM_SKIP)
        for item in items:
            if item.get_closest_marker("vllm") is not None:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("DSPARK_DEBUG", raising=False)


# ==== Local Hub server (owner: hub helper; see tests/hub_server.py) ================================
# huggingface_hub reads HF_ENDPOINT, HF_HUB_DISABLE_XET, HF_HOME and telemetry settings when it is
# *imported*, so the server socket is bound here, at conftest import (before any test module can
# import huggingface_hub), and the environment points at it. The session fixture starts serving.
import atexit as _atexit
import os as _os
import shutil as _shutil
import sys as _sys
import tempfile as _tempfile
import uuid as _uuid

from tests.hub_server import HubServer

HUB_SERVER = HubServer()  # bound to 127.0.0.1:<free port> now
_HF_HOME = _tempfile.mkdtemp(prefix="dspark-test-hf-home-")
_atexit.register(_shutil.rmtree, _HF_HOME, True)
_os.environ.update({
    "HF_ENDPOINT": HUB_SERVER.url,
    "HF_HUB_DISABLE_XET": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HOME": _HF_HOME,
})
for _name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
    _os.environ.pop(_name, None)
assert "huggingface_hub" not in _sys.modules, (
    "huggingface_hub was imported before tests/conftest.py could point it at the local Hub server")


@pytest.fixture(scope="session")
def hub_server():
    """The local Hub server (see tests/hub_server.py), serving for the whole session."""
    HUB_SERVER.start()
    yield HUB_SERVER
    HUB_SERVER.stop()


@pytest.fixture
def hub(hub_server):
    """The server with fault injection reset after the test."""
    yield hub_server
    hub_server.fail_lfs_uploads(0)
    hub_server.fail_commits(0)


@pytest.fixture
def hub_repo_id(hub_server):
    """A repository id no other test uses (the server is shared by the session)."""
    return f"{hub_server.user}/t-{_uuid.uuid4().hex[:10]}"


@pytest.fixture
def hub_token(hub_server):
    return hub_server.token
# ==== end of the local Hub server block ===========================================================
