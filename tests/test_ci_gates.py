"""The switches `.ci/run` relies on do what it relies on them for."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is importable here")
def test_a_required_vllm_that_is_missing_fails_the_run_instead_of_skipping():
    env = {**os.environ, "DSPARK_REQUIRE_VLLM": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "vllm", "-p", "no:cacheprovider",
                          "tests/test_engine_vllm.py", "tests/test_vllm_conformance.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 4, run.stdout + run.stderr
    assert "DSPARK_REQUIRE_VLLM is set but vllm is not importable" in run.stderr
    unset = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "vllm", "-p", "no:cacheprovider",
                            "tests/test_engine_vllm.py"], cwd=ROOT, env={**env, "DSPARK_REQUIRE_VLLM": ""},
                           capture_output=True, text=True)
    assert unset.returncode == 0 and "skipped" in unset.stdout


class _Item:
    """What `pytest_collection_modifyitems` reads of a test: its node id, fixtures and marks."""

    def __init__(self, nodeid: str, *fixtures: str) -> None:
        self.nodeid, self.fixturenames = nodeid, fixtures

    def get_closest_marker(self, name: str) -> None:
        return None


def test_under_xdist_the_files_of_a_shared_fixture_are_one_unit_and_the_longest_units_go_first(monkeypatch):
    from tests import conftest

    items = [_Item("tests/test_a.py::one"), _Item("tests/test_real_world.py::recipe", "real_drafts"),
             _Item("tests/test_b.py::two"), _Item("tests/test_real_speculators_quality.py::both"),
             _Item("tests/test_probe_real.py::rows", "real_drafts"), _Item("tests/test_a.py::three")]
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    serial = list(items)
    conftest.pytest_collection_modifyitems(None, serial)
    assert serial == items                           # one process: collection order
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.nodeid for item in items] == [      # the real drafts' unit, the speculators run, then the files
        "tests/test_real_world.py::recipe", "tests/test_probe_real.py::rows",
        "tests/test_real_speculators_quality.py::both", "tests/test_a.py::one", "tests/test_b.py::two",
        "tests/test_a.py::three"]
    units = [conftest._unit(item.nodeid) for item in items]
    assert units[0] == units[1] != units[2] and units[3] == units[5] == "tests/test_a.py" != units[4]


@pytest.mark.parametrize("nodeid, fixture", [("tests/test_train.py::drafts", "real_drafts"),
                                             ("tests/test_docs.py::toy", "toy_run"),
                                             ("tests/test_real_world.py::toy", "toy_run")])
def test_a_test_of_a_shared_fixture_outside_its_unit_is_refused(nodeid, fixture):
    """It would build the fixture again on the other worker: collection stops, naming the file and the table."""
    from tests import conftest

    with pytest.raises(pytest.UsageError, match=rf"{nodeid} uses the {fixture} fixture: add its file to UNITS"):
        conftest.pytest_collection_modifyitems(None, [_Item(nodeid, fixture)])
