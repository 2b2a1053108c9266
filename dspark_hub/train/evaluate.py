"""`dspark-hub eval`: acceptance of a draft with vLLM's definitions, simulated or measured by vLLM itself.

`engine="simulated"` (`acceptance.SIMULATION`) replays vLLM's greedy verify loop in plain PyTorch
on the target's float32 greedy continuation of each prompt, rolled out `max_new_tokens + k`
tokens so the last step can overshoot as it does in vLLM; the request stops at `max_new_tokens`
tokens or at a stop token (the target's EOS unless `ignore_eos`). On these fixtures the counts
equal vLLM's exactly (`tests/test_eval_parity.py`). `k` is the number of drafted tokens per step:
the speculators `speculative_tokens` (the block size for a DSpark drafting from its anchor), the
reference 7 for k3_dspark, or `block_size` when given. A prompt-lookup drafter runs beside it.

`engine="vllm"` (`dspark_hub.train.vllm_eval`) serves the target with the draft in vLLM and reads
the same counts from vLLM's metrics, plus `measured_by` and `lossless`.

The definitions and the simulation: `train.acceptance`; the draft, target and rollouts a run
measures on: `train.eval_inputs`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub import schemas
from dspark_hub.errors import MissingDependencyError, UsageError
from dspark_hub.format.digests import sha256_file
from dspark_hub.format.provenance import describe, identify
from dspark_hub.format.writer import atomic_path, refuse_own_inputs
from dspark_hub.progress import Progress, announce_stage
from dspark_hub.train import vllm_eval
from dspark_hub.train.acceptance import (
    BASELINE,
    DEFINITION,
    SIMULATION,
    AcceptanceStats,
    Measurement,
    draft_proposer,
    measure,
    measure_batched,
    measure_draft,
    measure_ngram,
    ngram_proposer,
    simulate,
    speculators_proposer,
)
from dspark_hub.train.config import canonical_dtype
from dspark_hub.train.eval_inputs import (
    DraftUnderTest,
    load_eval_rollouts,
    make_proposer,
    read_draft,
    refuse_unpaired_teacher,
    stop_token_ids,
)
from dspark_hub.train.generate import Prompt
from dspark_hub.train.rollouts import read_prompts
from dspark_hub.train.teacher import chat_template_digest, read_teacher_config, teacher_identity
from dspark_hub.train.vllm_worker import cpu_head_dim_problem

#: The names callers import from here, though they live in `acceptance` and `eval_inputs`.
__all__ = ["BASELINE", "DEFINITION", "DTYPES", "ENGINES", "SIMULATION", "AcceptanceStats", "DraftUnderTest",
           "EvalResult", "Measurement", "draft_proposer", "evaluate", "load_eval_rollouts", "measure",
           "measure_batched", "measure_draft", "measure_ngram", "ngram_proposer", "plot_acceptance", "read_draft",
           "refuse_unpaired_teacher", "require_matplotlib", "simulate", "speculators_proposer", "stop_token_ids"]

ENGINES = ("simulated", "vllm")
#: The vllm engine's dtypes (torch names; `config.canonical_dtype` also takes fp32, bf16, fp16).
DTYPES = ("float32", "bfloat16", "float16")
#: What the measured report carries over from the vLLM engine's own report.
MEASURED_KEYS = ("vllm_version", "untested_version", "torch", "platform", "speculative_config", "dtype",
                 "model_runner", "triton_interpret", "async_scheduling", "enable_prefix_caching")


@dataclass
class EvalResult:
    """What `dspark-hub eval` reports (`to_dict` is the `--json` document).

    `engine` is `simulated` or `vllm`; a vLLM measurement carries `measured_by` (the vLLM version,
    the exact speculative config, runner, interpreter, dtype) and `lossless` (its outputs equal
    plain greedy decoding's). A simulated one has neither (`null`).
    """

    draft: Measurement
    baseline: Measurement | None
    harness: dict[str, Any]
    reference: Measurement | None = None
    reference_path: str | None = None
    reference_identity: dict[str, Any] | None = None
    plot: str | None = None
    engine: str = "simulated"
    measured_by: dict[str, Any] | None = None
    lossless: bool | None = None

    @property
    def ok(self) -> bool:
        """False only for a vLLM measurement whose outputs differ from plain greedy decoding's."""
        return self.lossless is not False

    def to_dict(self) -> dict[str, Any]:
        overall = self.draft.overall
        by_dataset = {}
        for name, stats in sorted(self.draft.by_dataset.items()):
            entry = stats.to_dict()
            entry["baseline"] = self.baseline.by_dataset[name].to_dict() if self.baseline else None
            if self.reference is not None:
                entry["reference"] = self.reference.by_dataset[name].to_dict()
            by_dataset[name] = entry
        out = {"schema": schemas.command("eval"), "ok": self.ok, "engine": self.engine, **overall.to_dict(),
               "definition": DEFINITION, "by_dataset": by_dataset,
               "baseline": {"method": BASELINE, **self.baseline.overall.to_dict()} if self.baseline else None,
               "harness": self.harness, "reference": None, "plot": self.plot, "measured_by": self.measured_by,
               "lossless": self.lossless}
        if self.reference is not None:
            ref = self.reference.overall
            ratio = overall.acceptance_length / ref.acceptance_length
            out["reference"] = {"path": self.reference_path, "identity": self.reference_identity, **ref.to_dict(),
                                "ratio": ratio}
            # The card renders harness values as text: the reference by its Hub id or digests, never its path.
            named = describe(self.reference_identity) or "a local draft"
            out["harness"] = {**self.harness, "reference": f"{named} (acceptance length "
                              f"{ref.acceptance_length:.4f}; ratio {ratio:.4f})"}
        return out



def evaluate(draft: str | os.PathLike[str], *, teacher: str | None = None, prompts: str | None = None,
             data: str | None = None, reference: str | None = None, block_size: int | None = None,
             max_new_tokens: int = 256, batch_size: int = 8, plot: str | os.PathLike[str] | None = None,
             ignore_eos: bool = False, engine: str = "simulated", vllm_python: str | os.PathLike[str] | None = None,
             dtype: str = "float32", markov: bool = True, progress: Progress | None = None) -> EvalResult:
    """Acceptance of a draft with vLLM's definitions: simulated (next to a prompt-lookup drafter) or measured by vLLM.

    Args:
        draft: a k3_dspark or speculators DSpark checkpoint folder.
        teacher: local target folder; with `data`, defaults to the manifest's target.
        prompts: prompts JSONL (continued greedily by the target).
        data: a rollouts folder instead of `prompts` (simulated only; bfloat16 taps, and no tokens past
            its end, so the last step of each sequence can only undercount).
        reference: another draft measured on the same rollouts in the same run (simulated only).
        block_size: k, the drafted tokens per step (default: the speculators `speculative_tokens`,
            or 7 for k3_dspark, the reference draft's).
        max_new_tokens: output tokens per prompt (vLLM's `max_tokens`).
        batch_size: target generation batch.
        plot: also write a PNG of acceptance by position there (needs matplotlib; checked first).
        ignore_eos: never stop a request at the target's EOS.
        engine: `simulated` or `vllm` (`dspark_hub.train.vllm_eval`).
        vllm_python: the interpreter of a vLLM virtualenv (default: this one, when it has vllm).
        dtype: the vllm engine's dtype (`DTYPES`, or fp32, bf16, fp16); the simulation runs in
            float32, so only a float32 measurement can equal it exactly.
        markov: False drafts without the Markov head (a control; speculators drafts only).
        progress: called per simulated prompt / generated prompt / engine run.

    Raises:
        UsageError: not exactly one of `prompts` and `data`, no target, an engine that cannot do
            what was asked, or a draft eval cannot measure.
        MissingDependencyError: `plot` without matplotlib, or `vllm` without vLLM (before any work).
        EngineError: the vLLM engine failed (its log is kept and named).
    """
    if engine not in ENGINES:
        raise UsageError(f"engine {engine!r}; use one of {', '.join(ENGINES)}", param="engine")
    dtype = canonical_dtype(dtype, DTYPES)
    if dtype != "float32" and engine != "vllm":
        raise UsageError("the simulation runs in float32; another dtype is for the vllm engine", param="dtype")
    if plot is not None:
        refuse_own_inputs(plot, [("draft", draft), ("teacher", teacher), ("prompts", prompts), ("data", data),
                                 ("reference", reference), ("vllm_python", vllm_python)], param="plot", folder=False)
        require_matplotlib()   # fail before the long run, not after it
    under_test = read_draft(draft, block_size)
    if engine == "vllm":
        outcome = _evaluate_vllm(under_test, teacher=teacher, prompts=prompts, data=data, reference=reference,
                                 max_new_tokens=max_new_tokens, ignore_eos=ignore_eos, vllm_python=vllm_python,
                                 dtype=dtype, progress=progress)
    else:
        outcome = _evaluate_simulated(under_test, teacher=teacher, prompts=prompts, data=data, reference=reference,
                                      max_new_tokens=max_new_tokens, batch_size=batch_size, ignore_eos=ignore_eos,
                                      markov=markov, progress=progress)
    if plot is not None:
        outcome.plot = str(plot_acceptance(outcome, plot))
    return outcome


def _evaluate_simulated(draft: DraftUnderTest, *, teacher: str | None, prompts: str | None, data: str | None,
                        reference: str | None, max_new_tokens: int, batch_size: int, ignore_eos: bool, markov: bool,
                        progress: Progress | None) -> EvalResult:
    import torch  # heavy: only a simulated measurement pays for it

    ref_draft = read_draft(reference, draft.k, param="reference") if reference else None
    if ref_draft is not None and ref_draft.taps != draft.taps:
        raise UsageError(f"{reference}: taps layers {ref_draft.taps}, the draft {draft.taps}; a reference is "
                         "measured on the same rollouts, so it needs the same taps", param="reference")
    rollouts, teacher, facts = load_eval_rollouts(draft, teacher=teacher, prompts=prompts, data=data,
                                                  max_new_tokens=max_new_tokens, batch_size=batch_size,
                                                  progress=progress)
    bounds: dict[str, Any] = {} if data is not None else {"max_tokens": max_new_tokens,
                                                           "stop_ids": stop_token_ids(teacher, ignore_eos)}
    announce_stage(progress, "eval: draft", len(rollouts))
    with torch.no_grad():
        result = measure_batched(rollouts, make_proposer(draft, teacher, markov=markov), draft.k, progress, **bounds)
        ref = None if ref_draft is None else measure_batched(rollouts, make_proposer(ref_draft, teacher, markov=True),
                                                             draft.k, **bounds)
    harness = {"definition": DEFINITION, "mode": "simulated", "simulation": SIMULATION, "decoding": "greedy",
               "temperature": 0.0, "block_size": draft.k, "dtype": "float32", "format": draft.format.name,
               "draft": draft.path, "ignore_eos": ignore_eos, **facts}
    return EvalResult(result, measure_ngram(rollouts, draft.k, **bounds), harness, ref,
                      str(reference) if reference else None, identify(reference) if reference else None)


def _evaluate_vllm(draft: DraftUnderTest, *, teacher: str | None, prompts: str | None, data: str | None,
                   reference: str | None, max_new_tokens: int, ignore_eos: bool,
                   vllm_python: str | os.PathLike[str] | None, dtype: str, progress: Progress | None) -> EvalResult:
    if data is not None:
        raise UsageError("the vllm engine generates its own continuations; pass `prompts` instead", param="data")
    if reference is not None:
        raise UsageError("the vllm engine measures one draft per run; measure the reference in a run of its own",
                         param="reference")
    if prompts is None or teacher is None:
        raise UsageError("the vllm engine needs `prompts` and `teacher`", param="prompts" if prompts is None
                         else "teacher")
    python = vllm_eval.engine_python(vllm_python)       # before any work
    teacher_config = read_teacher_config(teacher, param="teacher")
    refuse_unpaired_teacher(draft, teacher_config, teacher)
    items = read_prompts(prompts, teacher, param="prompts", budget=max_new_tokens + draft.k)
    groups = dataset_groups(items)
    announce_stage(progress, "eval: vLLM, plain then speculative (2 runs of every prompt)", 2 * len(items))
    stops = stop_token_ids(teacher, ignore_eos)
    plain, speculative, python = vllm_eval.measure(teacher, draft.path, [item.input_ids for item in items], groups,
                                                   k=draft.k, max_tokens=max_new_tokens, stop_token_ids=stops,
                                                   python=python, dtype=dtype,
                                                   cpu_refusal=cpu_head_dim_problem(teacher_config, teacher))
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
                   "prompts_sha256": sha256_file(prompts), "python": python,
                   "timing_s": {"plain": plain.report["timing_s"], "speculative": report["timing_s"]},
                   "plain_run": {key: plain.report[key] for key in ("model_runner", "triton_interpret")}}
    harness = _measured_harness(draft, report, teacher, ignore_eos=ignore_eos, max_new_tokens=max_new_tokens,
                                prompts_sha256=measured_by["prompts_sha256"])
    return EvalResult(Measurement(overall, by_dataset), None, harness, engine="vllm", measured_by=measured_by,
                      lossless=plain.outputs == speculative.outputs)


def dataset_groups(items: list[Prompt]) -> list[list[int]]:
    """Prompt indices grouped by dataset label (sorted labels, then the unlabelled), empty groups dropped."""
    labels = sorted({item.dataset for item in items if item.dataset is not None})
    groups = [[i for i, item in enumerate(items) if item.dataset == label] for label in labels]
    groups += [[i for i, item in enumerate(items) if item.dataset is None]]
    return [g for g in groups if g]


def group_stats(run: vllm_eval.EngineRun, group: int, k: int, *, prompts: int) -> AcceptanceStats:
    """One group's counts, read from the speculative run's vLLM metrics."""
    metrics = run.metrics(group)
    per_position = [int(v) for v in metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos") or [0] * k]
    return AcceptanceStats(k, drafts=int(metrics.get("vllm:spec_decode_num_drafts") or 0),
                           accepted_per_position=per_position,
                           tokens=sum(len(out) for out in run.outputs[group]), prompts=prompts)


def _measured_harness(draft: DraftUnderTest, report: dict[str, Any], teacher: str, *, ignore_eos: bool,
                      max_new_tokens: int, prompts_sha256: str) -> dict[str, Any]:
    """The harness facts of a vLLM measurement (what the card shows)."""
    identity = teacher_identity(teacher).to_dict()
    engine = (f"vLLM {report['vllm_version']} ({report['model_runner']} runner"
              + (", Triton interpreter" if report["triton_interpret"] else "") + ")")
    return {"definition": DEFINITION, "mode": "measured", "decoding": "greedy", "temperature": 0.0,
            "block_size": draft.k, "dtype": report["dtype"], "format": draft.format.name, "draft": draft.path,
            "ignore_eos": ignore_eos, "engine": engine, "prompts_sha256": prompts_sha256,
            "max_new_tokens": max_new_tokens, "chat_template_sha256": chat_template_digest(teacher),
            "teacher": identity["label"], "teacher_identity": identity, "data": None}


def require_matplotlib() -> Any:
    """`matplotlib.pyplot` (Agg backend), or a `MissingDependencyError` naming the package."""
    try:
        import matplotlib  # heavy and optional: only `plot` needs it

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("needs matplotlib, which is not installed; pip install matplotlib",
                                     param="plot") from exc
    return plt


def plot_acceptance(result: EvalResult, path: str | os.PathLike[str]) -> Path:
    """PNG of per-position acceptance (draft, baseline, reference). Needs matplotlib."""
    plt = require_matplotlib()
    figure, axes = plt.subplots(figsize=(6, 4))
    series = [("draft", result.draft)]
    if result.baseline is not None:
        series.append(("prompt lookup", result.baseline))
    if result.reference is not None:
        series.append(("reference", result.reference))
    for label, measurement in series:
        rates = measurement.overall.per_position
        axes.plot(range(1, len(rates) + 1), rates, marker="o",
                  label=f"{label} (AL {measurement.overall.acceptance_length:.3f})")
    axes.set_xlabel("draft position k")
    axes.set_ylabel("a_k: fraction of steps accepting k drafts")
    axes.set_ylim(0, 1)
    axes.legend()
    figure.tight_layout()
    with atomic_path(path, force=True) as tmp:
        figure.savefig(tmp, dpi=120, format="png")
    plt.close(figure)
    return Path(path)
