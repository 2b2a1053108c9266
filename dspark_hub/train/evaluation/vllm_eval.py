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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub.errors import EngineError
from dspark_hub.progress import Progress, announce_stage
from dspark_hub.train.evaluation.acceptance import DEFINITION, AcceptanceStats, Measurement
from dspark_hub.train.evaluation.inputs import EvalInputs
from dspark_hub.train.target.generate import Prompt
from dspark_hub.vllm.availability import cpu_head_dim_problem, engine_python
from dspark_hub.vllm.child import Child, session

#: The engine process's module (`python -m`).
WORKER_MODULE = "dspark_hub.train.evaluation.vllm_eval_worker"
#: What the measured report carries over from the vLLM engine's own report.
MEASURED_KEYS = ("vllm_version", "untested_version", "torch", "platform", "speculative_config", "dtype",
                 "model_runner", "triton_interpret", "async_scheduling", "enable_prefix_caching")


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


def run_engine(python: str, job: dict[str, Any], *, what: str) -> EngineRun:
    """Run one engine in a child process and return its report.

    Raises:
        MissingDependencyError: `python` cannot start, or cannot import the pinned vLLM.
        UsageError: the engine refused the target (about `target`).
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

    `cpu_refusal` is why the target cannot run on vLLM's CPU attention (its head size), if so: the
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


@dataclass(frozen=True)
class Served:
    """A draft measured by vLLM serving it: the counts, the harness, how vLLM ran, whether it was lossless."""

    measurement: Measurement
    harness: dict[str, Any]
    measured_by: dict[str, Any]
    lossless: bool


def measure_served(inputs: EvalInputs, *, max_new_tokens: int, ignore_eos: bool, dtype: str,
                   progress: Progress | None = None) -> Served:
    """vLLM serves the target with the draft, in `inputs.python`: plain greedy, then speculative decoding; the
    counts from its metrics.

    Raises:
        EngineError: the vLLM engine failed (its log is kept and named).
    """
    interpreter = inputs.python or engine_python(None)
    draft, target, items = inputs.draft, inputs.target, inputs.prompts
    groups = dataset_groups(items)
    announce_stage(progress, "eval: vLLM, plain then speculative (2 runs of every prompt)", 2 * len(items))
    stops = inputs.stop_ids
    plain, speculative, interpreter = measure(target.path, draft.path, [item.input_ids for item in items], groups,
                                              k=draft.k, max_tokens=max_new_tokens, stop_token_ids=stops,
                                              python=interpreter, dtype=dtype,
                                              cpu_refusal=cpu_head_dim_problem(target.config, target.path))
    if progress:
        progress(2 * len(items))
    overall, by_dataset = AcceptanceStats(draft.k), {}
    for g, group in enumerate(groups):
        stats = group_stats(speculative, g, draft.k, prompts=len(group))
        overall.add(stats)
        label = items[group[0]].dataset
        if label is not None:
            by_dataset[label] = stats
    report = speculative.report
    measured_by = {"engine": "vllm", **{key: report[key] for key in MEASURED_KEYS}, "temperature": 0.0,
                   "max_tokens": max_new_tokens, "stop_token_ids": stops, "prompts": len(items),
                   "prompts_sha256": inputs.facts["prompts_sha256"], "python": interpreter,
                   "timing_s": {"plain": plain.report["timing_s"], "speculative": report["timing_s"]},
                   "plain_run": {key: plain.report[key] for key in ("model_runner", "triton_interpret")}}
    engine = (f"vLLM {report['vllm_version']} ({report['model_runner']} runner"
              + (", Triton interpreter" if report["triton_interpret"] else "") + ")")
    facts = inputs.facts
    harness = {"definition": DEFINITION, "mode": "measured", "decoding": "greedy", "temperature": 0.0,
               "block_size": draft.k, "dtype": report["dtype"], "format": draft.format.name, "draft": draft.path,
               "ignore_eos": ignore_eos, "engine": engine, "prompts_sha256": facts["prompts_sha256"],
               "max_new_tokens": max_new_tokens, "chat_template_sha256": facts["chat_template_sha256"],
               "teacher": facts["teacher"], "teacher_identity": facts["teacher_identity"], "data": None}
    return Served(Measurement(overall, by_dataset), harness, measured_by, plain.outputs == speculative.outputs)


def dataset_groups(items: list[Prompt]) -> list[list[int]]:
    """Prompt indices grouped by dataset label (sorted labels, then the unlabelled), empty groups dropped."""
    labels = sorted({item.dataset for item in items if item.dataset is not None})
    groups = [[i for i, item in enumerate(items) if item.dataset == label] for label in labels]
    groups += [[i for i, item in enumerate(items) if item.dataset is None]]
    return [g for g in groups if g]


def group_stats(run: EngineRun, group: int, k: int, *, prompts: int) -> AcceptanceStats:
    """One group's counts, read from the speculative run's vLLM metrics."""
    metrics = run.metrics(group)
    per_position = [int(v) for v in metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos") or [0] * k]
    return AcceptanceStats(k, drafts=int(metrics.get("vllm:spec_decode_num_drafts") or 0),
                           accepted_per_position=per_position,
                           tokens=sum(len(out) for out in run.outputs[group]), prompts=prompts)
