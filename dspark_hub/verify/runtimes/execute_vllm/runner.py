"""The entry points: `execute` (in this process) and `run_isolated` (in a child process, `vllm.child`).

`execute` loads the draft round after round, each round without the tensors that raised in the
rounds before, until a load gets through the tensor stream; the last round's trace gives the verdicts.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dspark_hub.errors import ExecutionFailed, UsageError
from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
from dspark_hub.format.registry import FORMATS
from dspark_hub.verify.family import detect
from dspark_hub.verify.runtimes.execute_vllm.classify import checkpoint_name, classify, parameters
from dspark_hub.verify.runtimes.execute_vllm.hooks import install
from dspark_hub.verify.runtimes.execute_vllm.internals import check_internals, require_vllm
from dspark_hub.verify.runtimes.execute_vllm.load_round import one_round
from dspark_hub.verify.runtimes.execute_vllm.result import ExecutedLoad
from dspark_hub.verify.runtimes.execute_vllm.stubs import SHIMS, STUBS
from dspark_hub.verify.runtimes.execute_vllm.trace import STATE, Trace
from dspark_hub.vllm.child import Child, session
from dspark_hub.vllm.pin import judge_version

#: The child process's module (`python -m`).
CHILD_MODULE = "dspark_hub.verify.runtimes.execute_vllm"


def execute(folder: str | os.PathLike[str], *, num_speculative_tokens: int = 7) -> ExecutedLoad:
    """Run vLLM's draft loader on `folder` in this process; see the package docstring.

    Raises:
        VllmNotAvailable: vLLM is not importable, or the version policy refuses it.
        VllmInternalsMoved: the installed vLLM lacks an internal the engine hooks.
        UsageError: the folder is not a k3_dspark or speculators DSpark draft.
    """
    path, fmt_name, config, names = _draft(folder)
    started = time.perf_counter()
    with _stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="dspark-execute-") as scratch:
        version = STATE.version or check_internals()
        STATE.version = version
        imported = time.perf_counter()
        install()
        t, outcome, raised, rounds = _load_until_through(path, fmt_name, config, Path(scratch), num_speculative_tokens)
        STATE.trace = None
    result = ExecutedLoad(draft=str(path), format=fmt_name, vllm_version=version,
                          model_class=outcome.get("model_class") or FORMATS[fmt_name].vllm_model_class or "",
                          outcome=outcome["outcome"], refusal=outcome.get("refusal"), rounds=rounds,
                          stubs=dict(STUBS), shims={k: v for k, v in SHIMS.items()
                                                    if k != "SHIM_CPU_KV_B_PROJ" or t.strict.get("shimmed")})
    warning = judge_version(version).warning
    if warning is not None:
        result.warnings.append(warning)
    result.seconds = {"import": round(imported - started, 3), "total": round(time.perf_counter() - started, 3)}
    if outcome["outcome"] not in ("refused at config parse", "refused at load"):
        _add_verdicts(result, t, outcome, names, raised)   # a refusal judged no tensor
    return result


def _draft(folder: str | os.PathLike[str]) -> tuple[Path, str, Mapping[str, Any], list[str]]:
    """(resolved folder, format name, config, tensor names) of a draft vLLM's DSpark loaders load."""

    path = Path(folder).resolve()
    view = open_checkpoint(LocalSource(path))
    fmt, _ = detect(view.config, view.tensors) if view.config is not None else (None, None)
    if fmt is None or fmt.vllm_model_class is None or view.config is None:
        raise UsageError(f"{path}: not a k3_dspark or speculators DSpark draft; vLLM's DSpark loaders load only "
                         "those", param="execute")
    return path, fmt.name, view.config, list(view.tensors)


def _load_until_through(path: Path, fmt_name: str, config: Mapping[str, Any], scratch: Path,
                        num_speculative_tokens: int) -> tuple[Trace, dict[str, Any], dict[str, str], int]:
    """Rounds until one gets through the tensor stream: (its trace, its outcome, tensor -> what it raised, rounds)."""
    excluded: set[str] = set()
    raised: dict[str, str] = {}
    rounds = 0
    while True:
        rounds += 1
        t, outcome = one_round(path, fmt_name, config, excluded, scratch, num_speculative_tokens)
        culprit = outcome.get("culprit")
        if outcome["outcome"] != "raised" or not isinstance(culprit, str) or culprit in excluded:
            return t, outcome, raised, rounds
        raised[culprit] = f"{outcome['error'][:400]} [{outcome['site']}]"
        excluded.add(culprit)


def _add_verdicts(result: ExecutedLoad, t: Trace, outcome: Mapping[str, Any], names: list[str],
                  raised: Mapping[str, str]) -> None:
    """The last round's tensor and parameter verdicts, and what its strict check did."""
    result.tensors = classify(t, names, raised)
    result.replaced = outcome.get("replaced") or {}
    if t.snapshot is not None:
        result.parameters = parameters(t, result.replaced)
    result.strict_check = {"ran": bool(t.strict.get("ran")),
                           "raised_for": [checkpoint_name(p) for p in t.strict.get("raised_for") or ()]}
    if outcome.get("error"):
        result.strict_check["error"] = outcome["error"]
        result.strict_check["site"] = outcome.get("site", "")


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """vLLM logs to stdout; keep it off ours (a caller's output, or a child's protocol stream)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run_isolated(folder: str | os.PathLike[str], *, timeout: float = 900.0) -> ExecutedLoad:
    """`execute(folder)` in a child process of this interpreter (`vllm.child`); the same result.

    Raises:
        VllmNotAvailable: vLLM is not importable here (checked before the child starts), or the version
            policy refuses it.
        VllmInternalsMoved, UsageError: raised in the child, re-raised here with its message.
        ExecutionFailed: the child died without a result, or gave none in `timeout` seconds.
    """
    require_vllm()
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    child = Child(CHILD_MODULE, what="vLLM loader execution", env=env, failure=ExecutionFailed)
    with session(child, stop_timeout=5.0):
        reply = child.request({"op": "execute", "folder": os.fspath(folder)}, timeout=timeout)
    return ExecutedLoad.from_dict(reply["result"])


def handle(request: Mapping[str, Any]) -> dict[str, Any]:
    """The child's side of `run_isolated` (`vllm.child.serve` calls it per request)."""
    if request.get("op") == "exit":
        return {}
    if request.get("op") != "execute" or not isinstance(request.get("folder"), str):
        raise ExecutionFailed(f"unknown request {request.get('op')!r}; the parent sends execute with a folder")
    return {"result": execute(request["folder"]).to_dict()}
