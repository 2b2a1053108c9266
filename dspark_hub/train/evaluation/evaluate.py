"""`dspark-hub eval`: acceptance of a draft with vLLM's definitions, simulated or measured by vLLM itself.

`engine="simulated"` (`acceptance.SIMULATION`) replays vLLM's greedy verify loop in plain PyTorch
on the target's float32 greedy continuation of each prompt, rolled out `max_new_tokens + k`
tokens so the last step can overshoot as it does in vLLM; the request stops at `max_new_tokens`
tokens or at a stop token (the target's EOS unless `ignore_eos`). On these fixtures the counts
equal vLLM's exactly (`tests/test_eval_parity.py`). `k` is the number of drafted tokens per step:
the speculators `speculative_tokens` (the block size for a DSpark drafting from its anchor), the
reference 7 for k3_dspark, or `block_size` when given. A prompt-lookup drafter runs beside it.

`engine="vllm"` (`dspark_hub.train.evaluation.vllm_eval`) serves the target with the draft in vLLM and reads
the same counts from vLLM's metrics, plus `measured_by` and `lossless`.

`evaluate` is three steps: open the inputs (`inputs.open_inputs`: the draft, the target, the
rollouts), choose the drafters (`drafters.sweep_drafter_for` for the draft's format, the reference's and
the prompt-lookup baseline), count (`serving.measure_serving`: every drafter, and the draft at the eval's k
and every k of a sweep, in one lockstep pass; acceptance by context length and, greedy, the confidence head's
calibration from the same steps; the expected speedup when costs are given); with the vllm engine, vLLM
serving the draft is the drafter and its metrics are the count (`vllm_eval.measure_served`).

With a temperature (`sampling`, `decoding.eval_sampling`) the paths are the target's own samples,
`samples` a prompt, and the count is vLLM's rejection sampling seen from each path (`sampled_eval`'s
verifier judges the same lockstep pass, k sweep included); the document then carries 95%
intervals over prompts and samples and the expected acceptance beside the counts (`EvalResult.intervals`,
`expected`). Every document carries its decoding (`sampling`) and its units, one record per (prompt,
sample), which `compare` pairs (docs/acceptance.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dspark_hub import schemas
from dspark_hub._compat import renamed_keywords
from dspark_hub.documents import Document
from dspark_hub.errors import UsageError
from dspark_hub.format.provenance import describe, identify
from dspark_hub.format.speculation_profile import PROFILE_NAME
from dspark_hub.format.writer import check_writable, refuse_own_inputs
from dspark_hub.progress import Progress, announce_stage
from dspark_hub.train.evaluation import vllm_eval
from dspark_hub.train.evaluation.acceptance import (
    BASELINE,
    DEFINITION,
    AcceptanceStats,
    Measurement,
    Sweep,
    exact_verify,
)
from dspark_hub.train.evaluation.by_context import ByContext
from dspark_hub.train.evaluation.calibration import Calibration
from dspark_hub.train.evaluation.decoding import GREEDY, EvalSampling, simulated_decoding
from dspark_hub.train.evaluation.drafters import choose_drafters
from dspark_hub.train.evaluation.inputs import open_inputs
from dspark_hub.train.evaluation.paths import Unit
from dspark_hub.train.evaluation.plot import plot_acceptance, require_matplotlib
from dspark_hub.train.evaluation.sampled_eval import sampled_verify
from dspark_hub.train.evaluation.serving import ServingOptions, measure_serving
from dspark_hub.train.evaluation.speedup import Speedup
from dspark_hub.train.evaluation.units import expected_summary, unit_intervals, unit_records
from dspark_hub.train.target.dtypes import canonical_dtype

ENGINES = ("simulated", "vllm")
#: The vllm engine's dtypes (torch names; `target.dtypes.canonical_dtype` also takes fp32, bf16, fp16).
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class EvalResult(Document):
    """What `dspark-hub eval` reports; its document is the `--json` output.

    `engine` is `simulated` or `vllm`; a vLLM measurement carries `measured_by` (the vLLM version,
    the exact speculative config, runner, interpreter, dtype) and `lossless` (its outputs equal
    plain greedy decoding's). A simulated one has neither (`null`).
    """

    SCHEMA = schemas.command("eval")
    KEYS = ("ok", "engine", "**overall", "definition", "by_dataset=datasets", "baseline=baseline_overall",
            "harness=shown_harness", "reference=reference_overall", "plot", "measured_by", "lossless",
            "sampling", "intervals", "expected", "units=records", "sweep", "speedup", "by_context", "calibration",
            "profile")

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
    #: How it decoded (greedy, or sampled as vLLM samples), and the (prompt, sample) of each of `draft.units`.
    sampling: EvalSampling = GREEDY
    units: list[Unit] = field(default_factory=list)
    #: `--k`: every k measured (the eval's own included); `--draft-cost`/`--costs measure`: the expected speedup
    sweep: Sweep | None = None
    speedup: Speedup | None = None
    #: `--by-context`: acceptance per context-length bucket; a confidence head's calibration (simulated only)
    by_context: ByContext | None = None
    calibration: Calibration | None = None
    #: `--profile`: the speculation_profile.json written beside the draft
    profile: str | None = None

    definition: ClassVar[str] = DEFINITION

    @property
    def records(self) -> list[dict[str, Any]]:
        """One record per (prompt, sample): its key, dataset, drafts, accepted and expected per position."""
        return unit_records(self.units, self.draft.units)

    @property
    def intervals(self) -> dict[str, Any] | None:
        """95% intervals of AL and each per-position rate over prompts (and samples), None under 2 prompts."""
        return unit_intervals(self.units, self.draft.units, expected=False)

    @property
    def expected(self) -> dict[str, Any] | None:
        """The expected acceptance along the sampled paths (the low-variance number), labelled; None for a
        measurement by vLLM (it counts only)."""
        if self.engine != "simulated":
            return None
        return expected_summary(self.units, self.draft.units, self.draft.overall, self.sampling)

    @property
    def ok(self) -> bool:
        """False only for a vLLM measurement whose outputs differ from plain greedy decoding's."""
        return self.lossless is not False

    @property
    def overall(self) -> AcceptanceStats:
        return self.draft.overall

    @property
    def datasets(self) -> dict[str, dict[str, Any]]:
        """Per dataset label (sorted): the draft's counts, the baseline's and the reference's beside them."""
        out = {}
        for name, stats in self.draft.datasets.items():
            entry = stats.to_dict()
            entry["baseline"] = self.baseline.by_dataset[name].to_dict() if self.baseline else None
            if self.reference is not None:
                entry["reference"] = self.reference.by_dataset[name].to_dict()
            out[name] = entry
        return out

    @property
    def baseline_overall(self) -> dict[str, Any] | None:
        if self.baseline is None:
            return None
        return {"method": BASELINE, **self.baseline.overall.to_dict(),
                "expected_acceptance_length": self.baseline.overall.expected_acceptance_length}

    @property
    def ratio(self) -> float | None:
        """The draft's acceptance length over the reference's."""
        if self.reference is None:
            return None
        return self.draft.overall.acceptance_length / self.reference.overall.acceptance_length

    @property
    def reference_overall(self) -> dict[str, Any] | None:
        if self.reference is None:
            return None
        return {"path": self.reference_path, "identity": self.reference_identity, **self.reference.overall.to_dict(),
                "ratio": self.ratio}

    @property
    def shown_harness(self) -> dict[str, Any]:
        """The harness; with a reference, the card's text for it: its Hub id or digests, never its path."""
        if self.reference is None:
            return self.harness
        named = describe(self.reference_identity) or "a local draft"
        return {**self.harness, "reference": f"{named} (acceptance length "
                f"{self.reference.overall.acceptance_length:.4f}; ratio {self.ratio:.4f})"}


@renamed_keywords(teacher="target")
def evaluate(draft: str | os.PathLike[str], *, target: str | None = None, prompts: str | None = None,
             data: str | None = None, reference: str | None = None, block_size: int | None = None,
             max_new_tokens: int = 256, batch_size: int = 8, plot: str | os.PathLike[str] | None = None,
             ignore_eos: bool = False, engine: str = "simulated", vllm_python: str | os.PathLike[str] | None = None,
             dtype: str = "float32", markov: bool = True, sampling: EvalSampling = GREEDY,
             serving: ServingOptions | None = None, force: bool = False,
             progress: Progress | None = None) -> EvalResult:
    """Acceptance of a draft with vLLM's definitions: simulated (next to a prompt-lookup drafter) or measured by vLLM.

    Args:
        draft: a k3_dspark or speculators DSpark checkpoint folder.
        target: local target folder; with `data`, defaults to the manifest's target.
        prompts: prompts JSONL (the target continues each: greedily, or sampled as `sampling` says).
        data: a rollouts folder instead of `prompts` (simulated only; bfloat16 taps, and no tokens past
            its end, so the last step of each sequence can only undercount).
        reference: another draft measured on the same rollouts in the same run (simulated only).
        block_size: k, the drafted tokens per step (default: the draft's own, e.g. `speculative_tokens`).
        max_new_tokens: output tokens per prompt (vLLM's `max_tokens`).
        batch_size: target generation batch.
        plot: also write a PNG of acceptance by position there (needs matplotlib; checked first, as is a file
            there already, refused without `force`).
        ignore_eos: never stop a request at the target's EOS.
        engine: `simulated` or `vllm` (`dspark_hub.train.evaluation.vllm_eval`).
        vllm_python: the interpreter of a vLLM virtualenv (default: this one, when it has vllm).
        dtype: the vllm engine's dtype (`DTYPES`, or fp32, bf16, fp16); the simulation runs in
            float32, so only a float32 measurement can equal it exactly.
        markov: False drafts without the Markov head (a control; speculators drafts only).
        sampling: the decoding (`decoding.eval_sampling`): greedy (the default, the counts of today), or
            a temperature, truncation, drafting method, samples a prompt and seed.
        serving: the k sweep, acceptance by context length, the costs of the expected speedup and the
            profile (`serving.ServingOptions`; simulated only).
        force: replace a plot at `plot` (the profile's is `serving.force`).
        progress: called per simulated prompt / generated prompt / engine run.

    Raises:
        UsageError: not exactly one of `prompts` and `data`, no target, an engine that cannot do
            what was asked, or a draft eval cannot measure.
        RefusedOverwriteError: a file at `plot` without `force`, or a profile beside the draft already without
            `serving.force` (before any work).
        MissingDependencyError: `plot` without matplotlib, or `vllm` without vLLM (before any work).
        EngineError: the vLLM engine failed (its log is kept and named).
    """
    serving = serving or ServingOptions()
    _check_arguments(draft, engine=engine, dtype=dtype, plot=plot, force=force, sampling=sampling, serving=serving,
                     inputs=[("target", target), ("prompts", prompts), ("data", data), ("reference", reference),
                             ("vllm_python", vllm_python)])
    inputs = open_inputs(draft, target=target, prompts=prompts, data=data, reference=reference,
                         block_size=block_size, engine=engine, max_new_tokens=max_new_tokens, batch_size=batch_size,
                         ignore_eos=ignore_eos, vllm_python=vllm_python, sampling=sampling,
                         longest_k=serving.lookahead(), progress=progress)
    if engine == "vllm":
        served = vllm_eval.measure_served(inputs, max_new_tokens=max_new_tokens, ignore_eos=ignore_eos,
                                          dtype=canonical_dtype(dtype, DTYPES), progress=progress)
        outcome = EvalResult(served.measurement, None, served.harness, engine="vllm", measured_by=served.measured_by,
                             lossless=served.lossless, sampling=sampling, units=served.units)
    else:
        import torch  # heavy: only a simulated measurement pays for it

        # a rollouts folder's sequences are measured to their end (no tokens past it)
        bounds = {} if data is not None else {"max_tokens": max_new_tokens, "stop_ids": inputs.stop_ids}
        lm_head = None if sampling.greedy else inputs.target.lm_head().float()
        drafters = choose_drafters(inputs, markov=markov, lm_head=lm_head)
        verify = exact_verify if lm_head is None else sampled_verify(inputs.path_targets, inputs.units, lm_head,
                                                                      sampling)
        announce_stage(progress, "eval: draft", len(inputs.rollouts or ()))
        with torch.no_grad():
            counted = measure_serving(inputs, drafters, serving, verify=verify, bounds=bounds, progress=progress)
        harness = {"definition": DEFINITION, "mode": "simulated", **simulated_decoding(sampling),
                   "block_size": inputs.draft.k, "dtype": "float32", "format": inputs.draft.format.name,
                   "draft": inputs.draft.path, "ignore_eos": ignore_eos, **inputs.facts}
        ref_path = inputs.reference.path if inputs.reference else None
        outcome = EvalResult(counted.sweep.by_k[inputs.draft.k].measurement, counted.others["baseline"], harness,
                             counted.others.get("reference"), ref_path, identify(ref_path) if ref_path else None,
                             sampling=sampling, units=inputs.units, sweep=counted.sweep if serving.ks else None,
                             speedup=counted.speedup, by_context=counted.by_context,
                             calibration=counted.calibration, profile=counted.profile)
    if plot is not None:
        outcome.plot = str(plot_acceptance(outcome.draft, plot, baseline=outcome.baseline,
                                           reference=outcome.reference, force=force))
    return outcome


def _check_arguments(draft: str | os.PathLike[str], *, engine: str, dtype: str, plot: str | os.PathLike[str] | None,
                     force: bool, sampling: EvalSampling, serving: ServingOptions,
                     inputs: Sequence[tuple[str, Any]]) -> None:
    """What can be refused before any input is read: the engine, dtype and serving combinations, and the plot and
    profile paths (an input's own path, a file there without its `force`, no matplotlib)."""
    if engine not in ENGINES:
        raise UsageError(f"engine {engine!r}; use one of {', '.join(ENGINES)}", param="engine")
    if canonical_dtype(dtype, DTYPES) != "float32" and engine != "vllm":
        raise UsageError("the simulation runs in float32; another dtype is for the vllm engine", param="dtype")
    if plot is not None:
        refuse_own_inputs(plot, [("draft", draft), *inputs], param="plot", folder=False)
        check_writable(plot, force=force)
        require_matplotlib()   # fail before the long run, not after it
    serving.check()
    if serving.asked and engine != "simulated":
        raise UsageError("the k sweep, context buckets, costs and profile are simulated; drop them for the vllm "
                         "engine, or run the simulated engine", param="engine")
    if serving.profile:
        check_profile_writable(draft, [item for item in inputs if item[0] != "vllm_python"], force=serving.force)


def check_profile_writable(draft: str | os.PathLike[str], inputs: Sequence[tuple[str, Any]], *, force: bool) -> None:
    """Before the long run: `speculation_profile.json` may be written beside the draft (the one file of the draft's
    folder eval writes: `profile.write_profile`) and is not there already, unless `force`.

    Raises:
        UsageError: the path is (a link to) one of the inputs.
        RefusedOverwriteError: a profile is there and `force` is off.
    """
    path = Path(draft) / PROFILE_NAME
    refuse_own_inputs(path, [("draft", draft), *inputs], param="profile", folder=False, keep=(PROFILE_NAME,))
    check_writable(path, force=force)
