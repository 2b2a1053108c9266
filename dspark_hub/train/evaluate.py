"""Acceptance evaluation: block-wise simulated greedy decoding on the teacher's own continuations.

Definition (printed with every result, `DEFINITION`): for each held-out prompt, the teacher's
greedy continuation is the path serving would emit. Starting at the first generated token
(`p = prompt length`), the draft proposes K tokens from the teacher's taps of positions `< p` and
the anchor `x_p` (its own Markov chain over its own drafts); `j` = the longest prefix of the drafts
equal to `x_{p+1..p+K}`; the step emits `j + 1` tokens (the +1 is the target's bonus token), and
the next anchor is `x_{p+j+1}`. Over all steps, `a_k` = fraction of steps whose first k drafts were
all accepted (so `a_1 >= a_2 >= ...`), and

    acceptance length = 1 + sum_k a_k = mean tokens emitted per target verification step.

This is exact for greedy speculative decoding on the teacher's greedy path ("teacher-forced": the
context is the teacher's own states on that path; not a serving measurement). The same procedure
runs a prompt-lookup drafter (n-gram copy from the sequence so far, longest n first) on the same
data, so a looping or degenerate dataset cannot pass for a good draft.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_hub import schemas
from dspark_hub.errors import MissingDependencyError, UsageError
from dspark_hub.progress import Progress, announce_total

DEFINITION = ("acceptance length = mean tokens emitted per target verification step = 1 + sum_k a_k, "
              "a_k = fraction of steps whose first k drafts all equal the teacher's greedy continuation "
              "(the 1 is the target's bonus token); block-wise simulated greedy decoding on teacher-greedy "
              "continuations with the teacher's own hidden states as context (teacher-forced, not served)")
BASELINE = ("prompt lookup (as transformers prompt_lookup_decoding): copy the K tokens that followed the earliest "
            "earlier occurrence of the last n = 3, 2, 1 tokens")


@dataclass
class AcceptanceStats:
    """Counts of one simulated decoding run; merge runs by adding."""

    block_size: int
    steps: int = 0
    accepted: int = 0
    hits: list[int] = field(default_factory=list)
    tokens: int = 0
    prompts: int = 0

    def __post_init__(self) -> None:
        if not self.hits:
            self.hits = [0] * self.block_size

    def record(self, accepted: int) -> None:
        self.steps += 1
        self.accepted += accepted
        for k in range(accepted):
            self.hits[k] += 1

    def add(self, other: AcceptanceStats) -> None:
        self.steps += other.steps
        self.accepted += other.accepted
        self.hits = [a + b for a, b in zip(self.hits, other.hits, strict=True)]
        self.tokens += other.tokens
        self.prompts += other.prompts

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.steps if self.steps else float("nan")

    @property
    def per_position(self) -> list[float]:
        return [h / self.steps if self.steps else float("nan") for h in self.hits]

    def to_dict(self) -> dict[str, Any]:
        return {"acceptance_length": self.acceptance_length, "per_position": self.per_position,
                "steps": self.steps, "prompts": self.prompts, "tokens": self.tokens}


def longest_prefix(draft: list[int], truth: list[int]) -> int:
    j = 0
    while j < len(draft) and j < len(truth) and draft[j] == truth[j]:
        j += 1
    return j


def simulate(rollout: Any, propose: Callable[[int], list[int]], block_size: int) -> AcceptanceStats:
    """Run the greedy decoding simulation over one rollout with `propose(p) -> drafts`."""
    tokens = rollout.input_ids.tolist()
    stats = AcceptanceStats(block_size, tokens=len(tokens) - rollout.prompt_length, prompts=1)
    p = rollout.prompt_length
    while p + block_size < len(tokens):
        accepted = longest_prefix(propose(p)[:block_size], tokens[p + 1:p + 1 + block_size])
        stats.record(accepted)
        p += accepted + 1
    return stats


def draft_proposer(model: Any, lm_head_weight: Any, rollout: Any, block_size: int) -> Callable[[int], list[int]]:
    """`propose(p)` for a k3_dspark draft: context = taps of positions < p, anchor = x_p."""
    import torch

    dtype, device = model.context_proj.weight.dtype, model.context_proj.weight.device
    with torch.no_grad():
        latents = model.encode_context(rollout.aux_hidden_states[None].to(device=device, dtype=dtype))
    ids = rollout.input_ids.to(device)

    def propose(p: int) -> list[int]:
        context = tuple(latent[:, :p] for latent in latents)
        proposal = model.propose_block(None, ids[p:p + 1], lm_head_weight, block_size=block_size,
                                       context_latents=context)
        return proposal.tokens[0].tolist()

    return propose


def ngram_proposer(rollout: Any, block_size: int, max_ngram: int = 3, min_ngram: int = 1) -> Callable[[int], list[int]]:
    """Prompt-lookup drafting over the tokens up to and including the anchor.

    As transformers' `prompt_lookup_decoding`: longest n first, the earliest earlier occurrence of
    the last n tokens, and the (up to K) tokens that followed it.
    """
    tokens = rollout.input_ids.tolist()

    def propose(p: int) -> list[int]:
        history = tokens[:p + 1]
        for n in range(max_ngram, min_ngram - 1, -1):
            suffix = history[-n:]
            for start in range(len(history) - n):
                if history[start:start + n] == suffix:
                    return history[start + n:start + n + block_size]
        return []

    return propose


@dataclass
class Measurement:
    """Acceptance over a set of rollouts, overall and per dataset label."""

    overall: AcceptanceStats
    by_dataset: dict[str, AcceptanceStats]

    def to_dict(self) -> dict[str, Any]:
        return {**self.overall.to_dict(), "by_dataset": {k: v.to_dict() for k, v in sorted(self.by_dataset.items())}}


def measure(rollouts: Iterable[Any], make_proposer: Callable[[Any], Callable[[int], list[int]]], block_size: int,
            progress: Progress | None = None) -> Measurement:
    """Simulate every rollout with the proposer `make_proposer(rollout)` builds."""
    overall, by_dataset = AcceptanceStats(block_size), {}
    for rollout in rollouts:
        stats = simulate(rollout, make_proposer(rollout), block_size)
        overall.add(stats)
        if rollout.dataset is not None:
            by_dataset.setdefault(rollout.dataset, AcceptanceStats(block_size)).add(stats)
        if progress:
            progress(1)
    return Measurement(overall, by_dataset)


def measure_draft(model: Any, lm_head_weight: Any, rollouts: Iterable[Any], block_size: int,
                  progress: Progress | None = None) -> Measurement:
    """Acceptance of a k3_dspark draft (in eval mode, no gradients) on rollouts."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return measure(rollouts, lambda r: draft_proposer(model, lm_head_weight, r, block_size), block_size,
                           progress)
    finally:
        model.train(was_training)


def measure_ngram(rollouts: Iterable[Any], block_size: int) -> Measurement:
    return measure(rollouts, lambda r: ngram_proposer(r, block_size), block_size)


# ----------------------------------------------------------------------------- the command


@dataclass
class EvalResult:
    """What `dspark-hub eval` reports (`to_dict` is the `--json` document)."""

    draft: Measurement
    baseline: Measurement
    harness: dict[str, Any]
    reference: Measurement | None = None
    reference_path: str | None = None
    plot: str | None = None

    def to_dict(self) -> dict[str, Any]:
        overall = self.draft.overall
        by_dataset = {}
        for name, stats in sorted(self.draft.by_dataset.items()):
            entry = stats.to_dict()
            entry["baseline"] = self.baseline.by_dataset[name].to_dict()
            if self.reference is not None:
                entry["reference"] = self.reference.by_dataset[name].to_dict()
            by_dataset[name] = entry
        out = {"schema": schemas.command("eval"), "acceptance_length": overall.acceptance_length,
               "per_position": overall.per_position, "definition": DEFINITION, "by_dataset": by_dataset,
               "prompts": overall.prompts, "tokens": overall.tokens, "steps": overall.steps,
               "baseline": {"method": BASELINE, **self.baseline.overall.to_dict()},
               "harness": self.harness, "reference": None, "plot": self.plot}
        if self.reference is not None:
            ref = self.reference.overall
            ratio = overall.acceptance_length / ref.acceptance_length
            out["reference"] = {"path": self.reference_path, **ref.to_dict(), "ratio": ratio}
            # The card renders harness values as text; a string here wins over the dict above.
            out["harness"] = {**self.harness, "reference": f"{self.reference_path} (acceptance length "
                              f"{ref.acceptance_length:.4f}; ratio {ratio:.4f})"}
        return out


def _load_draft(path: str | os.PathLike[str]) -> Any:
    import torch

    from dspark_hub.modeling import load_checkpoint

    return load_checkpoint(path, dtype=torch.float32).model.eval()


def load_eval_rollouts(draft_config: dict[str, Any], *, teacher: str | None, prompts: str | None, data: str | None,
                       max_new_tokens: int, batch_size: int, progress: Progress | None = None) -> tuple[Any, str, dict]:
    """(rollouts, teacher path, harness facts about the data) from a prompts file or a rollouts folder."""
    from dspark_hub.train.rollouts import MemoryRollouts, RolloutData, generate_rollouts, read_prompts
    from dspark_hub.train.teacher import (
        chat_template_digest,
        check_teacher_matches,
        load_teacher,
        read_json,
        sha256_file,
        teacher_identity,
    )

    if (prompts is None) == (data is None):
        raise UsageError("pass exactly one of `prompts` (with `teacher`) and `data`")
    if data is not None:
        rollouts = RolloutData(data)
        announce_total(progress, len(rollouts))
        teacher = teacher or rollouts.teacher_path
        settings = rollouts.manifest["settings"]
        identity = rollouts.manifest["teacher"]
        facts = {"prompts_sha256": settings["prompts_sha256"], "max_new_tokens": settings["max_new_tokens"],
                 "chat_template_sha256": rollouts.manifest.get("chat_template_sha256"),
                 "teacher": identity["label"], "teacher_identity": identity, "data": str(data)}
        if teacher is None:
            raise UsageError(f"{data}: the manifest names no teacher; pass `teacher`")
        return rollouts, teacher, facts
    if teacher is None:
        raise UsageError("needs `teacher`", param="prompts")
    check_teacher_matches(read_json(Path(teacher) / "config.json"), draft_config, teacher_name=teacher)
    model = load_teacher(teacher)
    items = read_prompts(prompts, teacher)
    announce_total(progress, 2 * len(items))   # generated, then measured
    rollouts = MemoryRollouts(list(generate_rollouts(model, items, draft_config["target_layer_ids"],
                                                     max_new_tokens=max_new_tokens, batch_size=batch_size,
                                                     progress=progress)))
    rollouts.rollouts.sort(key=lambda r: r.prompt_index)
    identity = teacher_identity(teacher).to_dict()
    facts = {"prompts_sha256": sha256_file(prompts), "max_new_tokens": max_new_tokens,
             "chat_template_sha256": chat_template_digest(teacher), "teacher": identity["label"],
             "teacher_identity": identity, "data": None}
    return rollouts, teacher, facts


def evaluate(draft: str | os.PathLike[str], *, teacher: str | None = None, prompts: str | None = None,
             data: str | None = None, reference: str | None = None, block_size: int = 7,
             max_new_tokens: int = 256, batch_size: int = 8, plot: str | os.PathLike[str] | None = None,
             progress: Progress | None = None) -> EvalResult:
    """Measure a draft (and optionally a reference draft) against the prompt-lookup baseline.

    Args:
        draft: k3_dspark checkpoint folder.
        teacher: local teacher folder (for rollouts and its lm_head); with `data`, defaults to the
            manifest's teacher.
        prompts: prompts JSONL (continued greedily by the teacher, in memory).
        data: a rollouts folder instead of `prompts`.
        reference: another draft measured on the same rollouts in the same run.
        block_size: K drafts per step (7 for Kimi-K3 serving).
        max_new_tokens: continuation budget with `prompts`.
        batch_size: teacher generation batch.
        plot: also write a PNG of acceptance by position there (needs matplotlib; checked first).
        progress: called per simulated prompt / generated prompt.

    Raises:
        UsageError: not exactly one of `prompts` and `data`, or no teacher.
        MissingDependencyError: `plot` without matplotlib (before any work).
    """
    from dspark_hub.train.teacher import read_json, read_lm_head

    if plot is not None:
        require_matplotlib()   # fail before the long run, not after it
    draft_config = read_json(Path(draft) / "config.json")
    rollouts, teacher, facts = load_eval_rollouts(draft_config, teacher=teacher, prompts=prompts, data=data,
                                                  max_new_tokens=max_new_tokens, batch_size=batch_size,
                                                  progress=progress)
    lm_head = read_lm_head(teacher).float()
    result = measure_draft(_load_draft(draft), lm_head, rollouts, block_size, progress)
    ref = measure_draft(_load_draft(reference), lm_head, rollouts, block_size) if reference else None
    harness = {"definition": DEFINITION, "mode": "teacher-forced", "decoding": "greedy", "temperature": 0.0,
               "block_size": block_size, "draft": str(draft), **facts}
    outcome = EvalResult(result, measure_ngram(rollouts, block_size), harness, ref,
                         str(reference) if reference else None)
    if plot is not None:
        outcome.plot = str(plot_acceptance(outcome, plot))
    return outcome


def require_matplotlib() -> Any:
    """`matplotlib.pyplot` (Agg backend), or a `MissingDependencyError` naming the package."""
    try:
        import matplotlib

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
    series = [("draft", result.draft), ("prompt lookup", result.baseline)]
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
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)
