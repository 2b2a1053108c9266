"""Shared test set-up: deterministic CLI output, hypothesis budget, and the local Hub server."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

#: Fixtures shared by several modules (`tiny`, a checkpoint written by `init`).
pytest_plugins = ["tests.card_fixtures"]

settings.register_profile("ci", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")


#: pytest-xdist's workers share the cores: each worker's torch, and every process it starts, gets its share of them
#: (torch's default, a thread per core in every worker, makes the threads of an op wait for each other).
_WORKERS = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
if _WORKERS:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(_WORKERS))))

#: Fixtures that take more than 5 s to build; every test using one is marked `slow`.
SLOW_FIXTURES = {"world"}      # tests/test_train.py: a trained teacher plus rollouts (~15 s)
VLLM_MISSING = importlib.util.find_spec("vllm") is None
VLLM_SKIP = "vllm is not importable here; run the engine tests with: $(.ci/venv-vllm.sh) -m pytest -m vllm"
#: `.ci/run` sets it: a missing vLLM must fail the run, not skip the tests that prove the engine claims.
VLLM_REQUIRED = os.environ.get("DSPARK_REQUIRE_VLLM", "") not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    if VLLM_MISSING and VLLM_REQUIRED:
        raise pytest.UsageError("DSPARK_REQUIRE_VLLM is set but vllm is not importable in this interpreter; "
                                "run under $(.ci/venv-vllm.sh) or unset it")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that need a slow fixture (so `-m "not slow"` skips building it); without vllm, skip
    every `vllm` test by one mark, which pytest's summary folds into one line a file. Under pytest-xdist, the
    longest units of work go first (`pytest_xdist_make_scheduler`)."""
    skip = pytest.mark.skip(reason=VLLM_SKIP)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _long_units_first(items)
    for item in items:
        for fixture, unit in SHARED_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()) and _unit(item.nodeid) != unit:
                raise pytest.UsageError(f"{item.nodeid} uses the {fixture} fixture: add its file to UNITS in "
                                        "tests/conftest.py, so that pytest-xdist builds the fixture once")
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if VLLM_MISSING and item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


# ---- pytest-xdist (`-n 2 --dist loadfile`, .ci/run) -------------------------------------------------------------
#: Each test file is one unit of work, run on one worker (its module fixtures are built once), except that the files
#: that share a costly session fixture are one unit together: `real_drafts` (tests/real_drafts.py) trains the
#: real-model drafts, `toy_run` runs docs/training.md's toy block (tests/toy_run.py).
REAL_DRAFTS, TOY_RUN = "real drafts", "toy run"
SHARED_FIXTURES = {"real_drafts": REAL_DRAFTS, "toy_run": TOY_RUN}
UNITS = {**{f"tests/{name}": REAL_DRAFTS for name in ("test_probe_real.py", "test_real_mistakes.py",
                                                     "test_real_world.py")},
         **{f"tests/{name}": TOY_RUN for name in ("test_recipe.py", "test_docs_numbers.py")}}
#: The longest units, handed out first so that they run side by side (a serial CI on the 2-core machine: the real
#: drafts' build and tests about 300 s, the speculators quality run 175 s; no other file takes a minute).
LONGEST = (REAL_DRAFTS, "tests/test_real_speculators_quality.py")


def _unit(nodeid: str) -> str:
    file = nodeid.split("::", 1)[0]
    return UNITS.get(file, file)


@pytest.hookimpl(optionalhook=True)     # the vLLM and speculators virtualenvs run the suite without pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with `UNITS`, the units handed out in the workers' collection order (`LONGEST` first,
    `_long_units_first`): the longest start at once, one on each worker, and the rest fill in around them.
    (`--dist loadgroup` with `xdist_group` marks would say the same, but pytest-xdist 3.8 does not group under
    pytest 9.2: pytest-dev/pytest-xdist#1386.)"""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Units(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False      # not by test count: the order `_long_units_first` chose
    return Units(config, log)


def _long_units_first(items: list[pytest.Item]) -> None:
    """The tests of `LONGEST`'s units first, in its order, then the rest; in collection order within each unit."""
    first = {unit: rank for rank, unit in enumerate(LONGEST)}
    items.sort(key=lambda item: first.get(_unit(item.nodeid), len(LONGEST)))


@pytest.fixture
def one_torch_thread():
    """Tiny matrices: a second torch thread only adds contention on a shared 2-core machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def real_drafts(tmp_path_factory):
    """One CI-sized trained draft per format on the SmolLM2 world (`tests/real_drafts.py`), built once a session
    (or the run `DSPARK_REAL_RUN` names)."""
    from tests.real_drafts import real_drafts as trained_or_given

    return trained_or_given(tmp_path_factory.mktemp("real-run"))


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory):
    """docs/training.md's toy block, run as written once a session in a fresh folder (`tests/toy_run.py`)."""
    from tests.toy_run import run_toy_block

    return run_toy_block(tmp_path_factory.mktemp("toy-run"))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("DSPARK_DEBUG", raising=False)
    # `finetune` sets its process's malloc and oneDNN caches (train/finetuning/allocator.py); run in-process by
    # CliRunner it would set them for every later test. tests/test_allocator.py runs them in processes of their own.
    monkeypatch.setenv("DSPARK_ALLOCATOR", "system")


@pytest.fixture(autouse=True, scope="session")
def _codes_are_registered():
    """Every `Finding` and `CheckpointFormatError` the suite creates carries a registered code.

    The static half (code literals in the source) is `tests/test_docs.py`; this half catches
    codes computed at run time on every path the suite takes.
    """
    from dspark_hub.errors import CheckpointFormatError
    from dspark_hub.report import Finding
    from tests.codes import CodeChecker

    registered = CodeChecker()
    originals = {Finding: Finding.__init__, CheckpointFormatError: CheckpointFormatError.__init__}

    def checked(cls):
        original = originals[cls]

        def __init__(self, code, *args, **kwargs):
            assert registered(code), f"{cls.__name__} code {code!r} is in no registry (see tests/codes.py)"
            original(self, code, *args, **kwargs)
        return __init__

    for cls in originals:
        cls.__init__ = checked(cls)
    yield
    for cls, original in originals.items():
        cls.__init__ = original


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
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HOME": _HF_HOME,
})
for _name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_XET"):
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
    hub_server.reset_faults()


@pytest.fixture
def hub_repo_id(hub_server):
    """A repository id no other test uses (the server is shared by the session)."""
    return f"{hub_server.user}/t-{_uuid.uuid4().hex[:10]}"


@pytest.fixture
def hub_token(hub_server):
    return hub_server.token
# ==== end of the local Hub server block ===========================================================
