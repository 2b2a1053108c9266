"""The 0.1 and 0.2 import paths keep working, and the documented paths (old and new) are the real ones."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from dspark_hub._compat import MOVED, MOVED_IN_0_3
from tests.docs_text import read, section

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = read("docs/architecture.md")
VLLM_PROCESS_ONLY = "dspark_hub.train.target.vllm_connector"
PYTHON_API = read("docs/python-api.md")

#: What the 0.1 README documented as the Python API (its "Python API" table and contract paragraph).
OLD_API = [
    "dspark_hub.checks.verify", "dspark_hub.writer.init_checkpoint", "dspark_hub.diff.diff",
    "dspark_hub.convert.convert", "dspark_hub.checksums.write_checksums", "dspark_hub.checksums.check_checksums",
    "dspark_hub.golden.write_golden", "dspark_hub.golden.check_golden", "dspark_hub.rollouts.make_rollouts",
    "dspark_hub.train.finetune", "dspark_hub.train.TrainConfig", "dspark_hub.evaluate.evaluate",
    "dspark_hub.cards.render_card", "dspark_hub.cardlint.lint_card", "dspark_hub.package.package",
    "dspark_hub.release.publish_checkpoint", "dspark_hub.contract.REFERENCE_CONFIG",
    "dspark_hub.contract.reference_config_bytes", "dspark_hub.contract.roster", "dspark_hub.contract.parameter_counts",
    "dspark_hub.contract.expected_header", "dspark_hub.contract.expected_file_size",
    "dspark_hub.contract.REFERENCE_ARTIFACT", "dspark_hub.modeling.export_code", "dspark_hub.modeling.load_checkpoint",
    "dspark_hub.modeling.save_checkpoint", "dspark_hub.modeling.register",
]


def resolve(dotted: str) -> Any:
    """Import the longest module prefix of `dotted`, then read the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name)
        return value
    raise ModuleNotFoundError(dotted)


def moved_table() -> dict[str, list[str]]:
    """docs/architecture.md's "Moved in 0.2" and "Moved in 0.3" tables: old module -> the new modules its row names."""
    rows = {}
    for line in (section(ARCHITECTURE, "Moved in 0.2") + section(ARCHITECTURE, "Moved in 0.3")).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`dspark_hub."):
            rows[cells[0].strip("`")] = re.findall(r"`(dspark_hub\.[\w.]+)`", cells[1])
    return rows


def test_the_documented_moved_table_is_compat_moved():
    assert {old: new[0] for old, new in moved_table().items()} == \
        {f"dspark_hub.{old}": f"dspark_hub.{targets[0]}" for old, targets in MOVED.items()}
    for old, targets in MOVED.items():
        assert set(moved_table()[f"dspark_hub.{old}"]) == {f"dspark_hub.{t}" for t in targets}, old


@pytest.mark.parametrize("old", OLD_API)
def test_a_documented_0_1_name_resolves_to_what_the_moved_table_names(old):
    module, _, name = old.rpartition(".")
    value = resolve(old)
    rows = moved_table()
    if module in rows:           # a moved module: the object is the one in the first new module that has it
        homes = [new for new in rows[module] if hasattr(importlib.import_module(new), name)]
        assert homes and value is getattr(importlib.import_module(homes[0]), name)
    assert not isinstance(value, types.ModuleType)


def test_the_0_1_root_names_still_resolve():
    import dspark_hub

    assert dspark_hub.roster is resolve("dspark_hub.format.contract.roster")
    assert dspark_hub.init_checkpoint is resolve("dspark_hub.ops.init.init_checkpoint")
    assert resolve("dspark_hub.verify.verify") is resolve("dspark_hub.verify.checks.verify")


def python_api_calls() -> list[str]:
    return sorted(set(re.findall(r"`(dspark_hub\.[\w.]+)\(", PYTHON_API)))


def test_the_python_api_table_is_seen():
    assert len(python_api_calls()) >= 15


@pytest.mark.parametrize("dotted", python_api_calls())
def test_every_call_in_the_python_api_section_resolves_to_a_function(dotted):
    value = resolve(dotted)
    assert callable(value) and not isinstance(value, types.ModuleType)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_importing_an_old_path_warns_naming_where_it_went(old, monkeypatch):
    monkeypatch.delitem(sys.modules, f"dspark_hub.{old}", raising=False)
    release = r"0\.3" if old in MOVED_IN_0_3 else r"0\.2"
    expected = rf"^dspark_hub\.{old} moved in {release} to dspark_hub\.{MOVED[old][0]}"
    with pytest.warns(DeprecationWarning, match=expected):
        importlib.import_module(f"dspark_hub.{old}")


def test_importing_the_new_paths_does_not_warn():
    """In a fresh interpreter that turns a DeprecationWarning into an error (re-importing here would swap
    the modules other tests hold)."""
    # vLLM loads the connector by module path inside its own process: it imports vLLM at module level.
    modules = sorted({f"dspark_hub.{targets[0]}" for targets in MOVED.values()} - {VLLM_PROCESS_ONLY})
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", f"import {', '.join(modules)}"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    old = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", "import dspark_hub.checks"],
                         capture_output=True, text=True)
    assert old.returncode == 1 and "dspark_hub.checks moved in 0.2 to dspark_hub.verify.checks" in old.stderr


def test_the_documented_finetune_is_the_call_that_dispatches_by_format():
    """docs/python-api.md documents `dspark_hub.train.finetune` for both formats: it is the command's own call (a
    speculators base trains through it: tests/test_speculators_finetune.py; a k3_dspark one: tests/test_train.py)."""
    from dspark_hub import train
    from dspark_hub.train.finetuning import finetuners

    assert train.finetune is finetuners.finetune
    assert "`dspark_hub.train.finetune(TrainConfig(...))`" in PYTHON_API


def functions_named(name: str, root: Path) -> list[str]:
    """The files under `root` that define a function `name` (at any depth)."""
    return sorted(str(path.relative_to(root)) for path in root.rglob("*.py")
                  if any(isinstance(node, ast.FunctionDef) and node.name == name
                         for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))))


def test_one_function_is_named_finetune(tmp_path):
    assert functions_named("finetune", ROOT / "dspark_hub") == ["train/finetuning/finetuners.py"]
    (tmp_path / "a.py").write_text("def finetune(config):\n    pass\n")
    (tmp_path / "b.py").write_text("class T:\n    def finetune(self):\n        pass\n")
    assert functions_named("finetune", tmp_path) == ["a.py", "b.py"]


def test_the_0_2_keywords_of_the_target_still_work_with_a_warning(tmp_path):
    """`teacher` became `target` in 0.3 (docs/glossary.md); the old keywords and attribute go in 0.4."""
    from dspark_hub.errors import CheckpointNotFoundError
    from dspark_hub.train import TrainConfig
    from dspark_hub.train.evaluation.evaluate import evaluate

    with pytest.warns(DeprecationWarning, match=r"^TrainConfig\(teacher=\) is target= since 0.3"):
        config = TrainConfig(base="b", out="o", teacher="t")
    assert config.target == "t" and config.to_dict()["teacher"] == "t" and "target" not in config.to_dict()
    with pytest.warns(DeprecationWarning, match=r"TrainConfig.teacher is .target since 0.3"):
        assert config.teacher == "t"
    with pytest.raises(TypeError, match="got both teacher= and target="):
        TrainConfig(base="b", out="o", teacher="t", target="u")
    with pytest.warns(DeprecationWarning, match=r"^evaluate\(teacher=\) is target= since 0.3"), \
            pytest.raises(CheckpointNotFoundError, match="nope"):
        evaluate(tmp_path / "nope", teacher=str(tmp_path), prompts=str(tmp_path / "p.jsonl"))


def test_the_0_2_names_of_the_target_module_still_resolve_with_a_warning(monkeypatch):
    import dspark_hub.train.target.target as target_module

    monkeypatch.delitem(sys.modules, "dspark_hub.train.teacher", raising=False)
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("dspark_hub.train.teacher")
    with pytest.warns(DeprecationWarning, match=r"dspark_hub.train.teacher.load_teacher is load_target since 0.3"):
        assert old.load_teacher is target_module.load_target
    with pytest.warns(DeprecationWarning, match="TeacherIdentity is TargetIdentity"):
        assert old.TeacherIdentity is target_module.TargetIdentity
