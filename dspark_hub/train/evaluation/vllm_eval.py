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

With a temperature (`decoding.EvalSampling`) each prompt is served `samples` times with vLLM's sampling
parameters (temperature, top-k, top-p, min-p) and a seed per request (`stream_seed(seed, prompt key, sample,
"path")`: a request's draws are reproducible, never the simulation's own, which agree with vLLM's in
distribution only); `draft_sample_method` goes into the speculative config when it is not vLLM's default.
There is no plain run then: at T > 0 losslessness is a statement about distributions, and equal outputs would
not test it (`lossless` is null; tests/test_sampled_acceptance.py tests the law). Per-request counts come
from vLLM's `per_request_spec_decode_metrics` (each request's histogram of accepted drafts a step), so every
(prompt, sample) is a unit of the eval's intervals and of `compare`; their sum must equal the engine's own
counters. vLLM's CPU wheel runs neither truncation (top-k, top-p) nor probabilistic drafting (their Triton
kernels fail in the interpreter: docs/acceptance-sampling.md); the engine process refuses them on a CPU in
one line, before vLLM starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub.errors import EngineError
from dspark_hub.progress import Progress, announce_stage
from dspark_hub.train.evaluation.acceptance import DEFINITION, AcceptanceStats, Measurement
from dspark_hub.train.evaluation.decoding import EvalSampling
from dspark_hub.train.evaluation.inputs import EvalInputs
from dspark_hub.train.evaluation.paths import Unit, sampled_prompts
from dspark_hub.train.evaluation.sampled_acceptance import stream_seed
from dspark_hub.train.target.generate import Prompt
from dspark_hub.vllm.availability import cpu_head_dim_problem, engine_python
from dspark_hub.vllm.child import Child, session
from dspark_hub.vllm.pin import PINNED_VERSION

#: The engine process's module (`python -m`).
WORKER_MODULE = "dspark_hub.train.evaluation.vllm_eval_worker"
#: What the measured report carries over from the vLLM engine's own report.
MEASURED_KEYS = ("vllm_version", "untested_version", "torch", "platform", "speculative_config", "dtype",
                 "model_runner", "triton_interpret", "async_scheduling", "enable_prefix_caching")
#: What vLLM's CPU wheel cannot sample (the engine process refuses it when it sees no CUDA device).
CPU_SAMPLING_REFUSAL = ("vLLM {version}'s CPU wheel cannot run {what} (its Triton kernel fails in the interpreter); "
                        "measure it on a GPU, or drop it (temperature alone with greedy drafting runs here)")


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


def sampling_job(sampling: EvalSampling, units: list[Unit]) -> dict[str, Any] | None:
    """The job's `sampling` (None: greedy): vLLM's sampling parameters, one seed per request, and what a CPU
    engine must refuse (`CPU_SAMPLING_REFUSAL`, filled in by the engine process)."""
    if sampling.greedy:
        return None
    seed = sampling.seed
    assert seed is not None
    cannot = [what for what, on in (("top-k", sampling.top_k > 0), ("top-p", sampling.top_p < 1),
                                    ("min-p", sampling.min_p > 0),
                                    ("probabilistic drafting", sampling.draft_sample_method == "probabilistic"))
              if on]
    return {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "min_p": sampling.min_p, "seeds": [stream_seed(seed, u.prompt_key, u.sample, "path") for u in units],
            "cpu_refusal": (CPU_SAMPLING_REFUSAL.format(version=PINNED_VERSION, what=" and ".join(cannot)) if cannot
                            else None)}


def measure(target: str | os.PathLike[str], draft: str | os.PathLike[str], prompts: list[list[int]],
            groups: list[list[int]], *, k: int, max_tokens: int, stop_token_ids: list[int], python: str | None,
            dtype: str = "float32", interpreter: bool | None = None, cpu_refusal: str | None = None,
            sampling: dict[str, Any] | None = None, draft_sample_method: str = "greedy",
            request_metrics: str = "summary") -> tuple[EngineRun | None, EngineRun, str]:
    """The plain greedy run and the speculative run on the same prompts (one engine at a time); with
    `sampling` (`sampling_job`) the speculative run alone.

    The plain run never uses Triton's interpreter; `interpreter` (None: on when the engine sees no CUDA
    device) is the speculative run's.

    `cpu_refusal` is why the target cannot run on vLLM's CPU attention (its head size), if so: the
    engine process, which knows whether it runs on CPU, refuses with it before vLLM starts.
    `request_metrics="detailed"` also reports each request's accepted drafts step by step (a parity probe's).

    Returns:
        (plain or None, speculative, the interpreter that ran them).
    """
    interpreter_path = engine_python(python)
    job = {"target": str(Path(target).resolve()), "prompts": prompts, "groups": groups, "max_tokens": max_tokens,
           "stop_token_ids": list(stop_token_ids), "dtype": dtype,
           "max_model_len": max(len(p) for p in prompts) + max_tokens + k + 1, "interpreter": False,
           "speculative_config": None, "cpu_refusal": cpu_refusal, "sampling": sampling,
           "request_metrics": request_metrics}
    plain = None if sampling is not None else run_engine(interpreter_path, job, what="plain greedy")
    spec: dict[str, Any] = {"method": "dspark", "model": str(Path(draft).resolve()), "num_speculative_tokens": k}
    if draft_sample_method != "greedy":
        spec["draft_sample_method"] = draft_sample_method
    speculative = run_engine(interpreter_path, {**job, "interpreter": interpreter, "speculative_config": spec},
                             what="speculative decoding")
    return plain, speculative, interpreter_path


@dataclass(frozen=True)
class Served:
    """A draft measured by vLLM serving it: the counts, the harness, how vLLM ran, whether it was lossless."""

    measurement: Measurement
    harness: dict[str, Any]
    measured_by: dict[str, Any]
    lossless: bool | None
    units: list[Unit]


def measure_served(inputs: EvalInputs, *, max_new_tokens: int, ignore_eos: bool, dtype: str,
                   progress: Progress | None = None) -> Served:
    """vLLM serves the target with the draft, in `inputs.python`: plain greedy, then speculative decoding (at
    T > 0 speculative decoding alone, `samples` requests a prompt); the counts from its metrics.

    Raises:
        EngineError: the vLLM engine failed, or its per-request counts do not add up to its own counters.
        UsageError: what the engine cannot run (on a CPU: truncation or probabilistic drafting).
    """
    interpreter = inputs.python or engine_python(None)
    draft, target, items, sampling = inputs.draft, inputs.target, inputs.prompts, inputs.sampling
    requests, units = sampled_prompts(items, sampling.samples)
    groups = dataset_groups(requests)
    runs = "speculative decoding" if not sampling.greedy else "plain then speculative (2 runs of every prompt)"
    announce_stage(progress, f"eval: vLLM, {runs}", len(requests))
    stops = inputs.stop_ids
    plain, speculative, interpreter = measure(target.path, draft.path, [r.input_ids for r in requests], groups,
                                              k=draft.k, max_tokens=max_new_tokens, stop_token_ids=stops,
                                              python=interpreter, dtype=dtype,
                                              cpu_refusal=cpu_head_dim_problem(target.config, target.path),
                                              sampling=sampling_job(sampling, units),
                                              draft_sample_method=sampling.draft_sample_method)
    if progress:
        progress(len(requests))
    overall, by_dataset = AcceptanceStats(draft.k), {}
    for g, group in enumerate(groups):
        stats = group_stats(speculative, g, draft.k, prompts=len({units[i].prompt_key for i in group}))
        overall.add(stats)
        label = requests[group[0]].dataset
        if label is not None:
            by_dataset[label] = stats
    report = speculative.report
    per_unit = unit_stats(speculative, groups, draft.k)
    ordered_units = [units[i] for group in groups for i in group]
    measured_by = {"engine": "vllm", **{key: report[key] for key in MEASURED_KEYS}, "temperature": sampling.temperature,
                   "sampling": sampling.to_dict(), "max_tokens": max_new_tokens, "stop_token_ids": stops,
                   "prompts": len(items), "prompts_sha256": inputs.facts["prompts_sha256"], "python": interpreter,
                   "timing_s": {"plain": plain.report["timing_s"] if plain else None,
                                "speculative": report["timing_s"]},
                   "plain_run": ({key: plain.report[key] for key in ("model_runner", "triton_interpret")} if plain
                                 else None)}
    engine = (f"vLLM {report['vllm_version']} ({report['model_runner']} runner"
              + (", Triton interpreter" if report["triton_interpret"] else "") + ")")
    facts = inputs.facts
    decoding = ({"decoding": "greedy", "temperature": 0.0} if sampling.greedy else
                {"decoding": "sampled", "temperature": sampling.temperature, "sampling": sampling.describe()})
    harness = {"definition": DEFINITION, "mode": "measured", **decoding,
               "block_size": draft.k, "dtype": report["dtype"], "format": draft.format.name, "draft": draft.path,
               "ignore_eos": ignore_eos, "engine": engine, "prompts_sha256": facts["prompts_sha256"],
               "max_new_tokens": max_new_tokens, "chat_template_sha256": facts["chat_template_sha256"],
               "teacher": facts["teacher"], "teacher_identity": facts["teacher_identity"], "data": None}
    lossless = None if plain is None else plain.outputs == speculative.outputs
    return Served(Measurement(overall, by_dataset, per_unit), harness, measured_by, lossless, ordered_units)


def unit_stats(run: EngineRun, groups: list[list[int]], k: int) -> list[AcceptanceStats]:
    """Each request's counts from its `spec_decode_metrics` histogram (steps by accepted drafts), in group order.

    Raises:
        EngineError: the requests' counts do not add up to the engine's own counters.
    """
    out = []
    for g, group in enumerate(groups):
        histograms = run.report["groups"][g].get("histograms") or []
        if len(histograms) != len(group):
            raise EngineError(f"vLLM reported {len(histograms)} per-request counts for {len(group)} requests; "
                              f"its per_request_spec_decode_metrics did not work as in {PINNED_VERSION}")
        for histogram, output in zip(histograms, run.outputs[g], strict=True):
            accepted = [sum(histogram[j + 1:]) for j in range(k)]
            out.append(AcceptanceStats(k, drafts=sum(histogram), accepted_per_position=accepted,
                                       expected_per_position=[float(a) for a in accepted], tokens=len(output),
                                       prompts=1))
        total = group_stats(run, g, k, prompts=0)
        mine = out[len(out) - len(group):]
        if (sum(s.drafts for s in mine), [sum(col) for col in zip(*(s.accepted_per_position for s in mine),
                                                                  strict=True)]) != \
                (total.drafts, total.accepted_per_position):
            raise EngineError("vLLM's per-request counts do not add up to its spec-decode counters "
                              f"(group {g}: {sum(s.drafts for s in mine)} drafts against {total.drafts})")
    return out


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
