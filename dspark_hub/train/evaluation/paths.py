"""The paths an eval measures on: its units (a prompt, and a sample of it) and the target's continuations of them.

A unit is one request: a prompt (its index in the prompts file, its key, its dataset) and a sample of it; a
greedy eval has one unit a prompt, a sampled one `samples` (`sampled_prompts`). `continue_prompts` has the
target, in the `transformers` engine (`target.engines.open_engine`, the one way rollouts are made), continue
every unit `max_new_tokens + k` tokens ignoring EOS with float32 taps, so the last step can overshoot as it does
in vLLM: greedily, or by sampling as vLLM samples (`PathDraws`: vLLM's processing order and tie rule, one random
stream per (seed, prompt, sample), so a unit's path does not depend on the batch it ran in), recording what each
sampling step drew from (`PathTarget`) for the sampled verification (`sampled_eval`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from dspark_hub.progress import Progress, announce_stage
from dspark_hub.train.data.rollouts import MemoryRollouts
from dspark_hub.train.evaluation.sampled_acceptance import make_generator, processed_logits, sample_token
from dspark_hub.train.target.engines import EngineOptions, open_engine

if TYPE_CHECKING:
    import torch

    from dspark_hub.train.evaluation.decoding import EvalSampling
    from dspark_hub.train.target.generate import Prompt, Rollout
    from dspark_hub.train.target.target import Target


def prompt_key(ids: Sequence[int]) -> str:
    """A prompt's key: the first 16 hex digits of the SHA-256 of its token ids (what pairs two evals' prompts)."""
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Unit:
    """One measured request: a prompt (its index in the prompts file, key and dataset) and a sample of it."""

    prompt_index: int
    prompt_key: str
    dataset: str | None
    sample: int


def rollout_unit(rollout: Rollout, sample: int = 0) -> Unit:
    """The unit of a greedy rollout (or a sampled one, given its sample)."""
    ids = rollout.input_ids[:rollout.prompt_length].tolist()
    return Unit(rollout.prompt_index, prompt_key(ids), rollout.dataset, sample)


def sampled_prompts(prompts: Sequence[Prompt], samples: int) -> tuple[list[Prompt], list[Unit]]:
    """Each prompt `samples` times, re-indexed by unit (its index in the returned lists), and the units."""
    units: list[Unit] = []
    rows: list[Prompt] = []
    for prompt in prompts:
        key = prompt_key(prompt.input_ids)
        for sample in range(samples):
            rows.append(replace(prompt, index=len(units)))
            units.append(Unit(prompt.index, key, prompt.dataset, sample))
    return rows, units


@dataclass
class PathTarget:
    """What the sampling steps of one path recorded: for generated position `start + s`, the log-normalizer of
    the processed logits it was drawn from, and (under truncation) the token ids it kept, sorted."""

    start: int
    log_norm: list[float] = field(default_factory=list)
    kept: list[torch.Tensor] | None = None


class PathDraws:
    """The `generate.Draw` rule of sampled paths: each row's next token from `target_probs` with its unit's own
    stream (`make_generator(seed, prompt key, sample, "path")`), recording each step's `PathTarget` numbers."""

    def __init__(self, units: Sequence[Unit], settings: EvalSampling) -> None:
        assert settings.seed is not None and not settings.greedy
        self.units = list(units)
        self.settings = settings
        self.targets: dict[int, PathTarget] = {}
        self.generators: dict[int, torch.Generator] = {}

    def __call__(self, group: list[Prompt]) -> Callable[[torch.Tensor], torch.Tensor]:
        import torch  # heavy: only a sampled eval pays for it

        seed, sampling = self.settings.seed, self.settings.sampling
        assert seed is not None
        for prompt in group:
            unit = self.units[prompt.index]
            self.generators[prompt.index] = make_generator(seed, unit.prompt_key, unit.sample, "path")
            self.targets[prompt.index] = PathTarget(len(prompt.input_ids),
                                                    kept=[] if sampling.truncated else None)

        def next_tokens(scores: torch.Tensor) -> torch.Tensor:
            processed = processed_logits(scores.float(), sampling)
            log_norm = torch.logsumexp(processed, dim=-1)
            probs = torch.exp(processed - log_norm[:, None])
            tokens = []
            for row, prompt in enumerate(group):
                target = self.targets[prompt.index]
                target.log_norm.append(float(log_norm[row]))
                if target.kept is not None:
                    target.kept.append(torch.isfinite(processed[row]).nonzero().flatten())
                tokens.append(sample_token(probs[row], self.generators[prompt.index]))
            return torch.tensor(tokens)

        return next_tokens


@dataclass
class Paths:
    """The target's continuations of an eval's units: `rollouts[i]` is the path of `units[i]`; a sampled eval's
    `targets` are what its sampling steps recorded (by rollout index)."""

    rollouts: MemoryRollouts
    units: list[Unit]
    targets: dict[int, PathTarget] = field(default_factory=dict)


def continue_prompts(target: Target, prompts: Sequence[Prompt], taps: list[int], sampling: EvalSampling, *,
                     max_new_tokens: int, lookahead: int, batch_size: int,
                     progress: Progress | None = None) -> Paths:
    """The target's float32 continuations of every unit, `max_new_tokens + lookahead` tokens ignoring EOS, with the
    taps of layers `taps`: greedy, one a prompt, or `sampling.samples` sampled paths a prompt (`batch_size` prompts
    a `generate` call either way)."""
    rows, units, draws = list(prompts), list[Unit](), None
    if not sampling.greedy:
        rows, units = sampled_prompts(prompts, sampling.samples)
        draws = PathDraws(units, sampling)
        # a prompt's samples share its `generate` call: on a CPU a call's time grows little with its rows
        batch_size *= sampling.samples
    announce_stage(progress, "eval: target continuations", len(rows))
    runner = open_engine("transformers", target, taps, EngineOptions(dtype="float32"))
    try:
        made = list(runner.rollouts(rows, mode="generate", max_new_tokens=max_new_tokens + lookahead,
                                    ignore_eos=True, batch_size=batch_size, progress=progress,
                                    states_dtype="float32", draw=draws))
    finally:
        runner.close()
    rollouts = MemoryRollouts(sorted(made, key=lambda r: r.prompt_index))
    if draws is None:
        return Paths(rollouts, [rollout_unit(r) for r in rollouts])
    return Paths(rollouts, units, draws.targets)
