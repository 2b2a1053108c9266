"""Import paths that moved keep working, with a warning: in 0.2 the flat modules became area packages,
in 0.3 `train/`'s flat modules became its four wings.

`dspark_hub.checks.verify` still resolves: `dspark_hub.checks` is a stand-in module whose
attributes come from the modules that replaced it (`MOVED`), looked up on first use. Importing an
old path raises a `DeprecationWarning` naming the new one: the 0.1 README documented these paths as
the Python API, so they stay until a release says they go. docs/architecture.md's "Moved in 0.2"
and "Moved in 0.3" tables are this one.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

#: old module (under dspark_hub) -> the modules that now hold its names, searched in order.
MOVED: dict[str, tuple[str, ...]] = {
    "reader": ("format.reader", "format.jsonio"), "contract": ("format.contract", "format.reader"),
    "tensorio": ("format.tensorio",), "writer": ("format.writer", "ops.init"),
    "checkpoint": ("format.checkpoint",), "checksums": ("hub.checksums", "format.digests", "format.jsonio"),
    "checks": ("verify.checks", "format.taps", "verify.dropin"), "deep": ("verify.deep",),
    "runtimes": ("verify.runtimes.loaders", "verify.runtimes.report", "verify.runtimes.verdicts"),
    "pairing": ("verify.pairing",), "family": ("verify.family",), "golden": ("verify.golden",),
    "convert": ("ops.convert",), "diff": ("ops.diff",),
    "teacher": ("train.target.target", "errors"), "rollouts": ("train.data.rollouts",),
    "objective": ("train.finetuning.objective",), "evaluate": ("train.evaluation.evaluate", "train.evaluation.plot"),
    "card_results": ("cards.results",), "cardlint": ("cards.lint",), "hub_vocab": ("cards.hub_vocab",),
    "release": ("hub.release",), "package": ("hub.package",),
}
#: `train`'s flat modules of 0.2 -> their wing (0.3); where a module's names were split, every module they went to.
MOVED_IN_0_3: dict[str, tuple[str, ...]] = {
    f"train.{old}": tuple(new if new == "errors" else f"train.{new}" for new in news) for old, news in (
        ("teacher", ("target.target", "target.generate", "errors")), ("generate", ("target.generate",)),
        ("engines", ("target.engines",)), ("vllm_engine", ("target.vllm_engine",)),
        ("vllm_worker", ("target.vllm_worker",)), ("vllm_connector", ("target.vllm_connector",)),
        ("toy", ("target.toy",)), ("rollouts", ("data.rollouts",)),
        ("hidden_state_files", ("data.hidden_state_files",)), ("draft_taps", ("data.draft_taps",)),
        ("evaluate", ("evaluation.evaluate", "evaluation.acceptance", "evaluation.drafters", "evaluation.inputs",
                      "evaluation.plot")),
        ("acceptance", ("evaluation.acceptance", "evaluation.drafters")),
        ("eval_inputs", ("evaluation.inputs", "evaluation.drafters")), ("vllm_eval", ("evaluation.vllm_eval",)),
        ("vllm_eval_worker", ("evaluation.vllm_eval_worker",)),
        ("trainer", ("finetuning.trainer", "finetuning.finetuners")),      # `finetune` dispatches by format now
        *((name, (f"finetuning.{name}",)) for name in (
            "checkpointer", "distributed", "training_log", "config", "plan", "objective",
            "objective_speculators", "finetune_speculators", "finetuners", "draft_step", "on_policy", "threads")),
    )
}
MOVED.update(MOVED_IN_0_3)
#: Names 0.3 renamed (`teacher` -> `target`, the glossary's word): an old path's stand-in resolves the old name to
#: the new one, with a `DeprecationWarning`, until 0.4.
RENAMED: dict[str, str] = {
    "load_teacher": "load_target", "teacher_identity": "target_identity", "TeacherIdentity": "TargetIdentity",
    "TeacherStates": "TargetStates", "TeacherEngine": "TargetEngine", "TeacherTargets": "TargetDistributions",
    "check_teacher_matches": "check_target_matches", "TeacherMismatchError": "TargetMismatchError",
    "TEACHER_EMBED_NAMES": "TARGET_EMBED_NAMES", "teacher_embedding": "target_embedding",
}


class _MovedModule(ModuleType):
    """A stand-in for a module that moved: attribute access reads the new modules."""

    _targets: tuple[str, ...]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):      # the import system's own probes (`__path__`, `__file__`): not a moved name
            raise AttributeError(name)
        if name in RENAMED:
            warnings.warn(f"{self.__name__}.{name} is {RENAMED[name]} since 0.3; the old name goes in 0.4",
                          DeprecationWarning, stacklevel=2)
            name = RENAMED[name]
        for target in self._targets:
            module = importlib.import_module(f"dspark_hub.{target}")
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} (moved to {', '.join(self._targets)}) has no attribute "
                             f"{name!r}")

    def __dir__(self) -> list[str]:
        return sorted({n for t in self._targets for n in dir(importlib.import_module(f"dspark_hub.{t}"))})


class _MovedModuleFinder:
    """Finds `dspark_hub.<old>` for every old name in `MOVED` (a meta path finder and its loader, by protocol:
    `importlib.abc` would import `importlib.resources`, tempfile and shutil at every start)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        prefix, _, old = fullname.partition(".")
        if prefix != "dspark_hub" or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, cast("Loader", self))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = _MovedModule(spec.name, f"moved to {', '.join(MOVED[spec.name.split('.', 1)[1]])}")
        module._targets = tuple(MOVED[spec.name.split(".", 1)[1]])
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (names resolve on first use); say where the module went."""
        old = module.__name__
        new = ", ".join(f"dspark_hub.{target}" for target in MOVED[old.split(".", 1)[1]])
        release = "0.3" if old.split(".", 1)[1] in MOVED_IN_0_3 else "0.2"
        warnings.warn(f"{old} moved in {release} to {new}; import it from there", DeprecationWarning, stacklevel=2)


def install() -> None:
    """Register the finder once (called by `dspark_hub/__init__.py`)."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())


F = TypeVar("F", bound=Callable[..., Any])


def renamed_keywords(**renamed: str) -> Callable[[F], F]:
    """Accept a function's keywords of 0.2 (`teacher=`) as their 0.3 names (`target=`), with a `DeprecationWarning`,
    until 0.4: `@renamed_keywords(teacher="target")`."""
    def decorate(function: F) -> F:
        called = function.__qualname__.removesuffix(".__init__")

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renamed.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{called}() got both {old}= and {new}=; pass {new}=")
                    warnings.warn(f"{called}({old}=) is {new}= since 0.3; the old keyword goes in 0.4",
                                  DeprecationWarning, stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)
        return cast(F, wrapper)
    return decorate
