"""Issue 29 item 1: no input is unpickled outside `weights_only=True`, and no state pointer leaves its folder.

- The source: every `torch.load` passes `weights_only=True`, nothing passes `weights_only=False`, and no
  module calls a pickle loader (`pickle`, `dill`, `cloudpickle`, `joblib`, `shelve`, `marshal`,
  `pandas.read_pickle`, `numpy.load` without `allow_pickle=False`): an AST scan of `dspark_hub/`, each
  form with a failing snippet, and the passing twins.
- A training state (`read_state`): pickles that would run code (os.system, exec, subprocess, a class
  of their own), or that are no state at all, are refused in one line, before anything in them runs;
  a state shaped like the trainers' loads.
- The pointer (`resume_file`): `latest.json` naming an absolute path, `..`, a subfolder, a link, a
  FIFO or anything but `step-NNNNNN.pt` of its own folder is refused; so is `latest.json` as a link
  or a FIFO, and a state-named link when there is no pointer.
- The training log a resume cuts back: a link, a FIFO or lines that are no log lines are refused.
- End to end (slow): `finetune --resume` of both trainers on a poisoned state or an escaping pointer,
  and a target whose `.bin` weights are such a pickle, each with a passing twin.
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from dspark_hub.errors import UsageError

from .cli_errors import assert_one_line_error
from .test_speculators_finetune import data

__all__ = ["data"]      # the fixture: rollouts of the speculators fixtures' verifier

PACKAGE = Path(__file__).resolve().parents[1] / "dspark_hub"

# ---------------------------------------------------------------- the source: one AST scan

#: Modules whose loaders run code from the bytes they read.
PICKLERS = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "joblib", "shelve", "marshal"}
LOADERS = {"load", "loads", "Unpickler", "open", "read_pickle"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def unsafe_loads(source: str, where: str) -> list[str]:
    """`file:line: why` for every way `source` could unpickle outside `weights_only=True`."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            for module in modules:
                top = module.split(".")[0]
                if top in PICKLERS and not (names and all(n.endswith("Error") for n in names)):
                    found.append(f"{line}: imports {module} (only its error types may be imported)")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        weights_only = _keyword(node, "weights_only")
        if weights_only is not None and not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
            found.append(f"{line}: {name}(weights_only={ast.unparse(weights_only)})")
        if name.endswith("torch.load") and weights_only is None:
            found.append(f"{line}: torch.load without weights_only=True")
        if name.split(".")[-1] in LOADERS and name.split(".")[0] in PICKLERS | {"pd", "pandas"}:
            found.append(f"{line}: {name}")
        allow = _keyword(node, "allow_pickle")
        if name in ("np.load", "numpy.load") and not (isinstance(allow, ast.Constant) and allow.value is False):
            found.append(f"{line}: {name} without allow_pickle=False")
    return found


UNSAFE = {
    "torch.load without the flag": "import torch\ntorch.load(path)\n",
    "torch.load(weights_only=False)": "import torch\ntorch.load(path, weights_only=False)\n",
    "a flag computed at run time": "import torch\ntorch.load(path, weights_only=trusted)\n",
    "from_pretrained(weights_only=False)": "model = Auto.from_pretrained(folder, weights_only=False)\n",
    "import pickle": "import pickle\n",
    "pickle.loads": "import pickle\npickle.loads(data)\n",
    "from pickle import load": "from pickle import load\n",
    "dill": "import dill\ndill.load(f)\n",
    "cloudpickle": "import cloudpickle\n",
    "joblib": "import joblib\njoblib.load(path)\n",
    "shelve": "import shelve\nshelve.open(path)\n",
    "marshal": "import marshal\nmarshal.loads(data)\n",
    "pandas.read_pickle": "import pandas as pd\npd.read_pickle(path)\n",
    "numpy.load": "import numpy as np\nnp.load(path)\n",
    "numpy.load(allow_pickle=True)": "import numpy as np\nnp.load(path, allow_pickle=True)\n",
}
SAFE = {
    "torch.load(weights_only=True)": "import torch\ntorch.load(handle, weights_only=True, map_location='cpu')\n",
    "from_pretrained(weights_only=True)": "model = Auto.from_pretrained(folder, weights_only=True)\n",
    "the error type only": "from pickle import UnpicklingError\n",
    "numpy.load(allow_pickle=False)": "import numpy as np\nnp.load(path, allow_pickle=False)\n",
    "json.load": "import json\njson.load(f)\n",
}


@pytest.mark.parametrize("name", list(UNSAFE))
def test_the_scan_finds_each_way_to_unpickle(name):
    assert unsafe_loads(UNSAFE[name], "snippet.py"), name


@pytest.mark.parametrize("name", list(SAFE))
def test_the_scan_passes_weights_only_loads(name):
    assert unsafe_loads(SAFE[name], "snippet.py") == []


def test_nothing_in_the_package_unpickles_outside_weights_only():
    problems = [p for path in sorted(PACKAGE.rglob("*.py"))
                for p in unsafe_loads(path.read_text(), f"dspark_hub/{path.relative_to(PACKAGE).as_posix()}")]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- a state file: read as data only

class _Run:
    """Pickles to a call of `function(*args)` when loaded, as a crafted state would."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


class Custom:
    """A class of the pickle's own: a weights-only load refuses to import it."""


def _marker(tmp_path: Path) -> Path:
    return tmp_path / "RAN"


def _save(path: Path, obj) -> Path:
    import torch

    torch.save(obj, path)
    return path


def _poisons(marker: Path) -> dict[str, object]:
    import subprocess

    import torch

    return {
        "os.system": {"model": _Run(os.system, f"touch {marker}")},
        "builtins.exec": {"model": _Run(exec, f"open({str(marker)!r}, 'w').close()")},
        "builtins.eval": {"step": _Run(eval, f"open({str(marker)!r}, 'w')")},
        "subprocess.call": {"rng": _Run(subprocess.call, ["touch", str(marker)])},
        "a class of its own": {"model": {"w": torch.zeros(2)}, "optimizer": Custom()},
        "a module of torch": {"model": _Run(torch.nn.Linear, 2, 2)},
    }


@pytest.mark.parametrize("name", ["os.system", "builtins.exec", "builtins.eval", "subprocess.call",
                                  "a class of its own", "a module of torch"])
def test_a_state_that_would_run_code_is_refused_before_it_runs(tmp_path, name):
    from dspark_hub.train.finetuning.checkpointer import read_state

    marker = _marker(tmp_path)
    path = _save(tmp_path / "step-000001.pt", _poisons(marker)[name])
    with pytest.raises(UsageError, match=r"refused \(.*\); nothing in it ran") as caught:
        read_state(path, ("model",))
    assert not marker.exists()
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize("name, content", [
    ("a bare pickle stream", lambda marker: pickle.dumps({"model": _Run(os.system, f"touch {marker}")}, protocol=4)),
    ("garbage", lambda marker: b"not a state at all"),
    ("empty", lambda marker: b""),
    ("a zip of nothing", lambda marker: b"PK\x05\x06" + b"\0" * 18),
    ("JSON", lambda marker: json.dumps({"model": {}}).encode()),
])
def test_a_file_that_is_no_state_is_refused_in_one_line(tmp_path, name, content):
    from dspark_hub.train.finetuning.checkpointer import read_state

    marker = _marker(tmp_path)
    path = tmp_path / "step-000001.pt"
    path.write_bytes(content(marker))
    with pytest.raises(UsageError) as caught:
        read_state(path, ("model",))
    assert not marker.exists() and "\n" not in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize("state, missing", [([1, 2], "model"), ({"model": {}}, "optimizer")])
def test_a_state_of_the_wrong_shape_names_what_it_lacks(tmp_path, state, missing):
    from dspark_hub.train.finetuning.checkpointer import read_state

    path = _save(tmp_path / "step-000001.pt", state)
    with pytest.raises(UsageError, match=f"not a training state \\(no {missing}"):
        read_state(path, ("model", "optimizer"))


def test_a_state_shaped_like_the_trainers_loads(tmp_path):
    """Weights, an AdamW state, a LambdaLR schedule, the RNG and the options: data a weights-only load rebuilds."""
    import torch

    from dspark_hub.train.finetuning.checkpointer import read_state
    from dspark_hub.train.finetuning.config import TrainConfig

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "step": 1, "tokens": 7, "rng": torch.get_rng_state(), "config": TrainConfig(base="b", out="o").to_dict()}
    path = _save(tmp_path / "step-000001.pt", state)       # as the trainers save it (torch.save's defaults)
    loaded = read_state(path, ("model", "optimizer", "scheduler", "step", "tokens", "rng"))
    assert torch.equal(loaded["model"]["weight"], model.weight) and loaded["config"]["base"] == "b"


# ---------------------------------------------------------------- the pointer: its own folder only

def _states(tmp_path: Path) -> Path:
    folder = tmp_path / "states"
    folder.mkdir()
    (folder / "step-000001.pt").write_bytes(b"one")
    (folder / "step-000002.pt").write_bytes(b"two")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "step-000009.pt").write_bytes(b"theirs")
    return folder


def _point(folder: Path, doc: object) -> None:
    (folder / "latest.json").write_text(json.dumps(doc))


POINTERS = {
    "an absolute path": lambda f: _point(f, {"file": str(f.parent / "outside" / "step-000009.pt")}),
    "..": lambda f: _point(f, {"file": "../outside/step-000009.pt"}),
    "a subfolder": lambda f: (f.joinpath("sub").mkdir(), f.joinpath("sub", "step-000003.pt").write_bytes(b"x"),
                              _point(f, {"file": "sub/step-000003.pt"})),
    "a link out": lambda f: (os.symlink(f.parent / "outside" / "step-000009.pt", f / "step-000003.pt"),
                             _point(f, {"file": "step-000003.pt"})),
    "a FIFO": lambda f: (os.mkfifo(f / "step-000003.pt"), _point(f, {"file": "step-000003.pt"})),
    "a missing state": lambda f: _point(f, {"file": "step-000007.pt"}),
    "another name": lambda f: _point(f, {"file": "evil.pt"}),
    "a number": lambda f: _point(f, {"file": 3}),
    "null": lambda f: _point(f, {"file": None}),
    "no file key": lambda f: _point(f, {"step": 2}),
    "a list": lambda f: _point(f, ["step-000002.pt"]),
    "not JSON": lambda f: (f / "latest.json").write_text("step-000002.pt"),
    "the pointer is a link": lambda f: ((f.parent / "outside" / "latest.json").write_text(
        json.dumps({"file": "step-000002.pt"})), os.symlink(f.parent / "outside" / "latest.json", f / "latest.json")),
    "the pointer is a FIFO": lambda f: os.mkfifo(f / "latest.json"),
    "no pointer, the newest state a link": lambda f: os.symlink(f.parent / "outside" / "step-000009.pt",
                                                                f / "step-000003.pt"),
    "no pointer, the newest state a FIFO": lambda f: os.mkfifo(f / "step-000003.pt"),
}


@pytest.mark.parametrize("name", list(POINTERS))
def test_a_pointer_that_leaves_its_folder_is_refused(tmp_path, name):
    from dspark_hub.train.finetuning.checkpointer import resume_file

    folder = _states(tmp_path)
    POINTERS[name](folder)
    with pytest.raises(UsageError) as caught:
        resume_file(folder)
    assert caught.value.param == "state_dir" and "\n" not in str(caught.value)


@pytest.mark.parametrize("pointer, chosen", [({"file": "step-000001.pt", "step": 1}, "step-000001.pt"),
                                             (None, "step-000002.pt")])
def test_a_pointer_into_its_own_folder_and_the_newest_state_are_taken(tmp_path, pointer, chosen):
    from dspark_hub.train.finetuning.checkpointer import resume_file

    folder = _states(tmp_path)
    if pointer is not None:
        _point(folder, pointer)
    assert resume_file(folder) == folder / chosen


LOGS = {
    "a link out": lambda log, outside: os.symlink(outside, log),
    "a FIFO": lambda log, outside: os.mkfifo(log),
    "a JSON array line": lambda log, outside: log.write_text('{"step": 1}\n[1]\n'),
    "a line without a step": lambda log, outside: log.write_text('{"loss": 1.0}\n'),
    "a step that is true": lambda log, outside: log.write_text('{"step": true}\n'),
    "not JSON": lambda log, outside: log.write_text("step 1\n"),
}


@pytest.mark.parametrize("name", list(LOGS))
def test_a_resumed_training_log_that_is_not_a_log_of_its_folder_is_refused(tmp_path, name):
    """The log is cut back to the state's step on resume: never through a link, never from a FIFO."""
    from dspark_hub.errors import CheckpointFormatError
    from dspark_hub.train.finetuning.training_log import LOG_NAME, TrainingLog

    folder = _states(tmp_path)
    outside = tmp_path / "outside" / "theirs.jsonl"
    outside.write_text('{"step": 1}\n{"step": 5}\n')
    LOGS[name](folder / LOG_NAME, outside)
    with pytest.raises((UsageError, CheckpointFormatError)) as caught:
        TrainingLog(folder, rank=0).truncate(2)
    assert "\n" not in str(caught.value) and LOG_NAME in str(caught.value)
    assert outside.read_text() == '{"step": 1}\n{"step": 5}\n'


def test_a_resumed_training_log_is_cut_back_to_the_state(tmp_path):
    from dspark_hub.train.finetuning.training_log import LOG_NAME, TrainingLog

    folder = _states(tmp_path)
    (folder / LOG_NAME).write_text("".join(json.dumps({"step": n}) + "\n" for n in (1, 2, 3)))
    TrainingLog(folder, rank=0).truncate(2)
    assert (folder / LOG_NAME).read_text() == '{"step": 1}\n{"step": 2}\n'


# ---------------------------------------------------------------- end to end: finetune --resume, a .bin target

def run(*args):
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="dspark-hub")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A random draft and its toy target, rollouts, and a two-step run that kept both states."""
    root = tmp_path_factory.mktemp("resume")
    assert run("init", root / "base").exit_code == 0
    assert run("init-teacher", root / "target", "--draft", root / "base").exit_code == 0
    (root / "prompts.jsonl").write_text("".join(json.dumps({"text": f"hello number {i} and more"}) + "\n"
                                                for i in range(4)))
    made = run("rollouts", "--target", root / "target", "--prompts", root / "prompts.jsonl", "--draft-config",
               root / "base" / "config.json", "--out", root / "data", "--max-new-tokens", 6)
    assert made.exit_code == 0, made.output
    done = _finetune(root, root / "first", "--steps", 2, "--save-every", 1, "--keep-states", 0)
    assert done.exit_code == 0, done.output
    return root


def _finetune(root: Path, out: Path, *extra):
    return run("finetune", "--base", root / "base", "--data", root / "data", "--out", out, "--batch-size", 2,
               "--anchors", 4, "--quiet", *extra)


def _resume(root: Path, tmp_path: Path, spoil) -> tuple[object, Path]:
    states = tmp_path / "states"
    shutil.copytree(root / "first.state", states)
    spoil(states)
    return _finetune(root, tmp_path / "again", "--steps", 3, "--resume", "--state-dir", states), states


@pytest.mark.slow
@pytest.mark.parametrize("name", ["os.system", "builtins.exec"])
def test_finetune_resume_refuses_a_poisoned_state(trained, tmp_path, name):
    marker = _marker(tmp_path)
    result, _ = _resume(trained, tmp_path,
                             lambda s: _save(s / "step-000002.pt", _poisons(marker)[name]))
    assert_one_line_error(result, "step-000002.pt", "nothing in it ran")
    assert not marker.exists() and not (tmp_path / "again").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["an absolute path", "..", "a link out"])
def test_finetune_resume_refuses_a_pointer_out_of_the_state_folder(trained, tmp_path, name):
    def escape(states: Path) -> None:
        outside = tmp_path / "outside"
        outside.mkdir()
        shutil.copy(states / "step-000001.pt", outside / "step-000009.pt")    # a real state, elsewhere
        POINTERS[name](states)
    result, _ = _resume(trained, tmp_path, escape)
    assert_one_line_error(result, "latest.json", "its own folder")
    assert not (tmp_path / "again").exists()


@pytest.mark.slow
def test_finetune_resumes_from_the_state_it_wrote(trained, tmp_path):
    result, _ = _resume(trained, tmp_path, lambda states: None)
    assert result.exit_code == 0, result.output
    log = (tmp_path / "again" / "training_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log if '"loss"' in line] == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("poisoned", [True, False])
def test_a_target_whose_bin_weights_would_run_code_is_refused(trained, tmp_path, poisoned):
    import torch
    from safetensors.torch import load_file

    target = tmp_path / "target"
    shutil.copytree(trained / "target", target)
    weights = load_file(target / "model.safetensors")
    marker = _marker(tmp_path)
    if poisoned:
        weights["lm_head.weight"] = _Run(os.system, f"touch {marker}")
    torch.save(weights, target / "pytorch_model.bin")
    (target / "model.safetensors").unlink()
    result = run("rollouts", "--target", target, "--prompts", trained / "prompts.jsonl", "--draft-config",
                 trained / "base" / "config.json", "--out", tmp_path / "data", "--max-new-tokens", 2)
    if poisoned:
        assert_one_line_error(result, str(target), "would import posix.system", "nothing in it ran")
        assert not marker.exists()
    else:
        assert result.exit_code == 0, result.output


@pytest.mark.slow
@pytest.mark.parametrize("spoil", ["a poisoned state", "a pointer out"])
def test_the_speculators_trainer_refuses_them_too(data, tmp_path, spoil):
    from .test_speculators_finetune import TARGET, _train, fixture

    states = tmp_path / "states"
    _train(fixture("dspark"), data["rollouts"], tmp_path / "part", steps=2, save_every=1, state_dir=str(states))
    marker = _marker(tmp_path)
    if spoil == "a poisoned state":
        _save(states / "step-000002.pt", _poisons(marker)["os.system"])
    else:
        (tmp_path / "outside").mkdir()
        shutil.copy(states / "step-000001.pt", tmp_path / "outside" / "step-000009.pt")
        POINTERS["an absolute path"](states)
    result = run("finetune", "--base", fixture("dspark"), "--data", data["rollouts"], "--out", tmp_path / "again",
                 "--steps", 3, "--target", TARGET, "--resume", "--state-dir", states)
    assert_one_line_error(result, "step-000002.pt" if spoil == "a poisoned state" else "latest.json")
    assert not marker.exists() and not (tmp_path / "again").exists()


def test_a_state_written_with_an_unsafe_torch_is_not_read(tmp_path, monkeypatch):
    """torch before 2.6 could run code from a weights-only load (CVE-2025-32434): resuming needs 2.6."""
    import torch

    from dspark_hub.train.finetuning.checkpointer import read_state

    path = _save(tmp_path / "step-000001.pt", {"model": {}})
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    with pytest.raises(UsageError, match=r"torch 2\.6"):
        read_state(path, ("model",))
    monkeypatch.setattr(torch, "__version__", "2.6.0+cpu")
    assert read_state(path, ("model",)) == {"model": {}}

