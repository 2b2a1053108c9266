"""`eval --temperature T`: acceptance as vLLM 0.32.0 measures it when it samples, simulated on the target's own paths.

The plan (docs/acceptance-sampling.md, "the target's own paths"): the target continues each prompt
`samples` times by sampling (`PathDraws`: vLLM's processing order and tie rule, `sampled_acceptance.target_probs`,
one random stream per (seed, prompt, sample), so a unit's path does not depend on the batch it ran in), and
today's verify loop runs on each sampled path with vLLM's rejection rule seen from the path
(`sampled_verify`):

- greedy drafting (`draft_sample_method="greedy"`, vLLM's default at any temperature): a draft is accepted
  where it equals the path token, the count is the greedy comparison; the expected acceptance of position i
  is `1[drafts before i equal the path] * p_i(draft_i)`, the target's probability of the drafted token;
- probabilistic drafting: the drafter gives its q logits along the path (its Markov head chained on the
  path's tokens), a draft is accepted with probability `min(1, q(x) / p(x))` of the path token x using one
  uniform per path position (`sampled_acceptance.acceptance_uniforms`), and the expected acceptance is
  `sampled_acceptance.expected_prefix`.

The path's p at a position is read back from the sampling step that drew it: the log-normalizer of the
processed logits (and the tokens truncation kept) are recorded while the target generates
(`PathTarget`), and a token's logit is recomputed from the captured final state (`final @ lm_head[x]`): the
two agree to float32 rounding, so a probability is exact to about 1e-6, and membership of the kept set is
the sampling step's own. Every unit (one prompt, one sample) keeps its counts (`Measurement.units`) for the
intervals (`acceptance_intervals`) and paired comparisons (`compare`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dspark_hub.documents import Document
from dspark_hub.errors import UsageError
from dspark_hub.train.evaluation.acceptance import Measurement, VerifyRound, longest_prefix
from dspark_hub.train.evaluation.sampled_acceptance import (
    DRAFT_SAMPLE_METHODS,
    Sampling,
    acceptance_uniforms,
    accepted_count,
    make_generator,
    processed_logits,
    sample_token,
)

if TYPE_CHECKING:
    import torch

    from dspark_hub.train.target.generate import Prompt, Rollout

#: What a sampled simulated number is, in a card's label (`simulated (<this>, k=K, ...)`).
SAMPLED_SIMULATION = "vLLM's rejection-sampling verify loop on the target's float32 sampled paths"
#: Samples per prompt when a temperature is given and `samples` is not (docs/acceptance.md says why).
DEFAULT_SAMPLES = 2


@dataclass(frozen=True)
class EvalSampling(Document):
    """How an eval decodes: greedy (temperature 0, one path a prompt) or sampled as vLLM samples.

    `draft_sample_method` is vLLM's `speculative_config.draft_sample_method` (greedy: the draft's argmax
    at any temperature, verified as a one-hot q); `samples` paths a prompt, each with its own random
    stream from `seed`.
    """

    KEYS = ("temperature", "top_k", "top_p", "min_p", "draft_sample_method", "samples", "seed", "describe")

    sampling: Sampling = field(default_factory=Sampling)
    draft_sample_method: str = "greedy"
    samples: int = 1
    seed: int | None = None

    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    @property
    def top_k(self) -> int:
        return self.sampling.top_k

    @property
    def top_p(self) -> float:
        return self.sampling.top_p

    @property
    def min_p(self) -> float:
        return self.sampling.min_p

    @property
    def greedy(self) -> bool:
        return self.sampling.greedy

    def describe(self) -> str:
        """`greedy`, or `temperature 1, top-p 0.9; greedy drafting; 4 samples a prompt (seed 0)`."""
        if self.greedy:
            return "greedy"
        return (f"{self.sampling.describe()}; {self.draft_sample_method} drafting; "
                f"{self.samples} sample{'s' if self.samples != 1 else ''} a prompt (seed {self.seed})")

    def same_distribution(self, other: EvalSampling) -> bool:
        """Whether two evals sample the same laws (the seed and the sample count may differ)."""
        return (self.sampling, self.draft_sample_method) == (other.sampling, other.draft_sample_method)


GREEDY = EvalSampling()


def eval_sampling(temperature: float = 0.0, *, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                  draft_sample_method: str = "greedy", samples: int | None = None, seed: int = 0) -> EvalSampling:
    """The decoding of one eval, checked.

    Raises:
        UsageError: a bad sampling parameter, truncation or samples or a drafting method without a
            temperature (greedy decoding has one path a prompt), or samples below 1.
    """
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if draft_sample_method not in DRAFT_SAMPLE_METHODS:
        raise UsageError(f"{draft_sample_method!r}; use one of {', '.join(DRAFT_SAMPLE_METHODS)} (vLLM's "
                         "draft_sample_method)", param="draft_sample_method")
    if sampling.greedy:
        if samples not in (None, 1):
            raise UsageError("greedy decoding has one path a prompt; samples need a temperature above 0",
                             param="samples")
        if draft_sample_method != "greedy":
            raise UsageError("at temperature 0 vLLM drafts and verifies greedily; the drafting method needs a "
                             "temperature above 0", param="draft_sample_method")
        return GREEDY
    if samples is not None and samples < 1:
        raise UsageError(f"{samples}; pass 1 or more samples a prompt", param="samples")
    return EvalSampling(sampling, draft_sample_method, DEFAULT_SAMPLES if samples is None else samples, seed)


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


def count_prompts(measurement: Measurement, units: Sequence[Unit]) -> Measurement:
    """A sampled measurement with `prompts` counting distinct prompts (each loop counted its request as one)."""
    measurement.overall.prompts = len({u.prompt_key for u in units})
    for name, stats in measurement.by_dataset.items():
        stats.prompts = len({u.prompt_key for u in units if u.dataset == name})
    return measurement


# ----------------------------------------------------------------------------- the target's sampled paths


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


# ----------------------------------------------------------------------------- verification on the paths


@dataclass
class _Path:
    """One rollout as the sampled verification reads it."""

    tokens: list[int]
    final: torch.Tensor          # [T, H] float32 final states
    target: PathTarget
    unit: Unit


def sampled_verify(targets: dict[int, PathTarget], units: Sequence[Unit], lm_head: torch.Tensor,
                   settings: EvalSampling) -> Callable[[list[Rollout], int], VerifyRound]:
    """The `acceptance.Verifier` of a sampled eval (module docstring): rollouts carry their unit index as
    `prompt_index` (`sampled_prompts`); `targets` are `PathDraws.targets`."""
    def verifier(rollouts: list[Rollout], k: int) -> VerifyRound:
        paths = [_Path(r.input_ids.tolist(), r.final_hidden_states.float(), targets[r.prompt_index],
                       units[r.prompt_index]) for r in rollouts]

        def verify(requests: list[tuple[int, int]], proposals: list[Any]) -> list[tuple[int, list[float] | None]]:
            return _verify_round(paths, requests, proposals, k, lm_head, settings)

        return verify

    return verifier


def _verify_round(paths: list[_Path], requests: list[tuple[int, int]], proposals: list[Any], k: int,
                  lm_head: torch.Tensor, settings: EvalSampling) -> list[tuple[int, list[float] | None]]:
    """Greedy drafts (token lists) and probabilistic ones (q logits `[k, V]` along the path) of one round."""
    import torch  # heavy: only a sampled eval pays for it

    out: list[tuple[int, list[float] | None]] = []
    wanted: list[tuple[int, int, int]] = []          # (path index, position, drafted token)
    slots: list[tuple[int, int]] = []                # (request, slot) of each wanted probability
    for n, ((i, p), proposal) in enumerate(zip(requests, proposals, strict=True)):
        if isinstance(proposal, torch.Tensor):
            out.append(_verify_rows(paths[i], p, proposal, lm_head, settings))
            continue
        drafts = list(proposal)[:k]
        accepted = longest_prefix(drafts, paths[i].tokens[p + 1:p + 1 + k])
        out.append((accepted, [0.0] * k))
        for m in range(min(accepted + 1, len(drafts))):    # position m counts only if the drafts before it held
            wanted.append((i, p + 1 + m, drafts[m]))
            slots.append((n, m))
    for (n, m), prob in zip(slots, _token_probs(paths, wanted, lm_head, settings) if wanted else [], strict=True):
        expected = out[n][1]
        assert expected is not None
        expected[m] = prob
    return out


def _token_probs(paths: list[_Path], wanted: list[tuple[int, int, int]], lm_head: torch.Tensor,
                 settings: EvalSampling) -> list[float]:
    """p_t(token) for each (path, position t, token): the sampling step's normalizer and kept set, the token's
    logit from the final state at t - 1."""
    import torch  # heavy: only a sampled eval pays for it

    rows = torch.stack([paths[i].final[t - 1] for i, t, _ in wanted])
    logits = (rows * lm_head[torch.tensor([token for _, _, token in wanted])].float()).sum(dim=-1)
    out = []
    for (i, t, token), logit in zip(wanted, logits.tolist(), strict=True):
        target = paths[i].target
        s = t - target.start
        if not 0 <= s < len(target.log_norm):
            out.append(0.0)       # past what was generated (a rollouts folder's end): nothing to accept
            continue
        if target.kept is not None and not bool((target.kept[s] == token).any()):
            out.append(0.0)
            continue
        out.append(math.exp(logit / settings.temperature - target.log_norm[s]))
    return out


def _verify_rows(path: _Path, p: int, q_logits: torch.Tensor, lm_head: torch.Tensor,
                 settings: EvalSampling) -> tuple[int, list[float]]:
    """Probabilistic drafting at anchor p: q = softmax(q_logits / T), p rows from the final states; accept with
    `min(1, q(x) / p(x))` of the path token x and the path's uniforms, the expected by `expected_prefix`."""
    import torch  # heavy: only a sampled eval pays for it

    from dspark_hub.train.evaluation.sampled_acceptance import PathBlock, draft_probs, expected_prefix

    k = q_logits.shape[0]
    target, seed, unit = path.target, settings.seed, path.unit
    assert seed is not None
    n = min(k, len(path.tokens) - 1 - p, len(target.log_norm) - (p + 1 - target.start))
    if n <= 0:
        return 0, [0.0] * k
    positions = range(p + 1, p + 1 + n)
    z = path.final[p:p + n] @ lm_head.float().T
    p_rows = torch.exp(z / settings.temperature - torch.tensor([target.log_norm[t - target.start]
                                                               for t in positions])[:, None])
    if target.kept is not None:
        mask = torch.zeros_like(p_rows, dtype=torch.bool)
        for row, t in enumerate(positions):
            mask[row, target.kept[t - target.start]] = True
        p_rows = p_rows.masked_fill(~mask, 0.0)
    q_rows = draft_probs(q_logits[:n], settings.sampling, "probabilistic")
    path_tokens = torch.tensor(path.tokens[p + 1:p + 1 + n])
    p_token = p_rows.gather(-1, path_tokens[:, None]).squeeze(-1)
    q_token = q_rows.gather(-1, path_tokens[:, None]).squeeze(-1)
    # p(x) = 0 only where the recomputed row misses a kept token's mass by rounding: then accept iff q(x) > 0
    acceptance = torch.where(p_token > 0, torch.clamp(q_token / p_token.clamp_min(1e-300), max=1.0),
                             (q_token > 0).to(p_token.dtype))
    block = PathBlock(acceptance=acceptance, overlap=torch.minimum(p_rows, q_rows).sum(dim=-1))
    uniforms = acceptance_uniforms(seed, unit.prompt_key, unit.sample, len(path.tokens))[p + 1:p + 1 + n]
    accepted = int(accepted_count(acceptance.double(), uniforms))
    expected = expected_prefix(block).tolist()
    return accepted, [*expected, *[0.0] * (k - n)]
