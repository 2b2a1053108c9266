"""Every exception dspark-hub raises lives in `dspark_hub/errors.py` and has an `error_code` of its own: the `code`
of the CLI's error JSON (`--json`) says which error it was, never the root's `ERROR`."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from dspark_hub import errors
from dspark_hub.errors import DsparkError, UsageError

PACKAGE = Path(__file__).resolve().parent.parent / "dspark_hub"
CLASSES = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
           if issubclass(cls, DsparkError) and cls.__module__ == errors.__name__]


def code_problems(classes: list[type[DsparkError]]) -> list[str]:
    """A class (other than the root) whose `error_code` it inherits, or shares with another class."""
    problems, owners = [], {}
    for cls in classes:
        if cls is not DsparkError and "error_code" not in vars(cls):
            problems.append(f"{cls.__name__}: no error_code of its own (inherits {cls.error_code!r})")
        elif cls.error_code in owners:
            problems.append(f"{cls.__name__}: error_code {cls.error_code!r} is {owners[cls.error_code]}'s too")
        owners.setdefault(cls.error_code, cls.__name__)
    return problems


def test_every_error_class_has_its_own_code():
    assert len(CLASSES) >= 13 and code_problems(CLASSES) == []


def test_an_inherited_or_shared_code_is_named():
    class Inherits(UsageError):
        pass

    class Shares(DsparkError):
        error_code = "USAGE"

    assert code_problems([DsparkError, UsageError, Inherits, Shares]) == [
        "Inherits: no error_code of its own (inherits 'USAGE')", "Shares: error_code 'USAGE' is UsageError's too"]


def error_classes_defined_in(root: Path) -> list[str]:
    """`file: Class` for every class under `root` whose base is one of `errors`' classes."""
    names = {cls.__name__ for cls in CLASSES}
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                    (base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)) in names
                    for base in node.bases):
                found.append(f"{path.relative_to(root)}: {node.name}")
    return found


def test_every_error_class_lives_in_errors_py(tmp_path):
    assert {entry.split(":")[0] for entry in error_classes_defined_in(PACKAGE)} == {"errors.py"}
    (tmp_path / "elsewhere.py").write_text("from dspark_hub.errors import DsparkError\n\n"
                                           "class MismatchError(DsparkError):\n    pass\n")
    assert error_classes_defined_in(tmp_path) == ["elsewhere.py: MismatchError"]


def test_the_old_name_of_the_target_mismatch_still_resolves_with_a_warning():
    with pytest.warns(DeprecationWarning, match="TeacherMismatchError is TargetMismatchError since 0.3"):
        old = errors.TeacherMismatchError
    assert old is errors.TargetMismatchError and old.error_code == "TARGET_MISMATCH"
    with pytest.raises(AttributeError):
        _ = errors.NoSuchError
