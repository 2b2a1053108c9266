"""`eval --engine vllm`: acceptance measured by vLLM itself, serving the target with the draft.

Two engine runs, one after the other, each in a child process of the vLLM interpreter
(`vllm_eval_worker`, launched by `dspark_hub.vllm.child`: vLLM patches torch for its whole process,
and its virtualenv need not have dspark_hub installed): plain greedy decoding (the
lossless reference), then speculative decoding with `{"method": "dspark", "model": DRAFT,
"num_speculative_tokens": k}`. Both are offline `vllm.LLM` runs, greedy, prompts as token ids,
the same sampling parameters and stop tokens the simulated eval uses. vLLM's own
`vllm:spec_decode_*` counters are the measurement; the outputs of the two runs must be equal
(greedy speculative decoding is lossless).

On a machine without CUDA, vLLM's CPU wheel runs DSpark through Model Runner V2 with Triton's
interpreter (`vllm_eval_worker` explains the route); a k3_dspark draft needs vLLM's MLA path,
which runs on GPUs (`bench/gpu_smoke_eval_vllm.py`). The plain run needs no Triton: it takes vLLM's
native CPU path (Model Runner V1), measured 22x faster than the interpreted V2 runner with equal
outputs (vLLM 0.32.0, 8 SmolLM2 prompts x 96 tokens: 3.1 s against 67.9 s), and it is what plain greedy
decoding on that machine is.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub.errors import EngineError
from dspark_hub.vllm.availability import missing_vllm, vllm_importable
from dspark_hub.vllm.child import Child, session

#: The engine process's module (`python -m`).
WORKER_MODULE = "dspark_hub.train.evaluation.vllm_eval_worker"


@dataclass(frozen=True)
class EngineRun:
    """One finished engine run: what the worker reported."""

    report: dict[str, Any]

    @property
    def outputs(self) -> list[list[list[int]]]:
        return [group["outputs"] for group in self.report["groups"]]

    def metrics(self, group: int) -> dict[str, Any]:
        metrics: dict[str, Any] = self.report["groups"][group]["metrics"]
        return metrics


def engine_python(python: str | os.PathLike[str] | None) -> str:
    """The interpreter to run vLLM in: `python`, else this one when it can import vllm.

    Raises:
        MissingDependencyError: no `python` and vllm is not importable here.
    """
    if python is not None:
        return str(python)
    if vllm_importable():
        return sys.executable
    raise missing_vllm("the vllm engine", param="vllm_python")


def run_engine(python: str, job: dict[str, Any], *, what: str) -> EngineRun:
    """Run one engine in a child process and return its report.

    Raises:
        MissingDependencyError: `python` cannot start, or cannot import the pinned vLLM.
        UsageError: the engine refused the teacher (about `teacher`).
        EngineError: the process failed or the engine refused; the message names the log (kept).
    """
    child = Child(WORKER_MODULE, what=f"vllm engine ({what})", python=python, failure=EngineError,
                  python_param="vllm_python")
    with session(child):
        report = child.request({"op": "run", "job": job})
    return EngineRun(report)


def measure(target: str | os.PathLike[str], draft: str | os.PathLike[str], prompts: list[list[int]],
            groups: list[list[int]], *, k: int, max_tokens: int, stop_token_ids: list[int], python: str | None,
            dtype: str = "float32", interpreter: bool | None = None,
            cpu_refusal: str | None = None) -> tuple[EngineRun, EngineRun, str]:
    """The plain greedy run and the speculative run on the same prompts (one engine at a time).

    The plain run never uses Triton's interpreter; `interpreter` (None: on when the engine sees no CUDA
    device) is the speculative run's.

    `cpu_refusal` is why the teacher cannot run on vLLM's CPU attention (its head size), if so: the
    engine process, which knows whether it runs on CPU, refuses with it before vLLM starts.

    Returns:
        (plain, speculative, the interpreter that ran them).
    """
    interpreter_path = engine_python(python)
    job = {"target": str(Path(target).resolve()), "prompts": prompts, "groups": groups, "max_tokens": max_tokens,
           "stop_token_ids": list(stop_token_ids), "dtype": dtype,
           "max_model_len": max(len(p) for p in prompts) + max_tokens + k + 1, "interpreter": False,
           "speculative_config": None, "cpu_refusal": cpu_refusal}
    plain = run_engine(interpreter_path, job, what="plain greedy")
    spec = {"method": "dspark", "model": str(Path(draft).resolve()), "num_speculative_tokens": k}
    speculative = run_engine(interpreter_path, {**job, "interpreter": interpreter, "speculative_config": spec},
                             what="speculative decoding")
    return plain, speculative, interpreter_path
