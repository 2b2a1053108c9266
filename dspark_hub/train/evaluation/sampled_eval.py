"""`eval --temperature T`: acceptance as vLLM 0.32.0 measures it when it samples, simulated on the target's own paths.

The plan (docs/acceptance-sampling.md, "the target's own paths"): the target continues each prompt
`samples` times by sampling (`paths.PathDraws`: vLLM's processing order and tie rule,
`sampled_acceptance.target_probs`, one random stream per (seed, prompt, sample), so a unit's path does not
depend on the batch it ran in), and today's verify loop runs on each sampled path with vLLM's rejection rule
seen from the path (`sampled_verify`, the `acceptance.Verifier` of a sampled eval):

- greedy drafting (`draft_sample_method="greedy"`, vLLM's default at any temperature): a draft is accepted
  where it equals the path token, the count is the greedy comparison; the expected acceptance of position i
  is `1[drafts before i equal the path] * p_i(draft_i)`, the target's probability of the drafted token;
- probabilistic drafting: the drafter gives its q logits along the path (its Markov head chained on the
  path's tokens), a draft is accepted with probability `min(1, q(x) / p(x))` of the path token x using one
  uniform per path position (`sampled_acceptance.acceptance_uniforms`), and the expected acceptance is
  `sampled_acceptance.expected_prefix`.

The path's p at a position is read back from the sampling step that drew it: the log-normalizer of the
processed logits (and the tokens truncation kept) are recorded while the target generates
(`paths.PathTarget`), and a token's logit is recomputed from the captured final state (`final @ lm_head[x]`): the
two agree to float32 rounding, so a probability is exact to about 1e-6, and membership of the kept set is
the sampling step's own. Every unit (one prompt, one sample) keeps its counts (`Measurement.units`) for the
intervals (`acceptance_intervals`) and paired comparisons (`compare`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dspark_hub.train.evaluation.acceptance import VerifyRound, longest_prefix
from dspark_hub.train.evaluation.sampled_acceptance import acceptance_uniforms, accepted_count

if TYPE_CHECKING:
    import torch

    from dspark_hub.train.evaluation.decoding import EvalSampling
    from dspark_hub.train.evaluation.paths import PathTarget, Unit
    from dspark_hub.train.target.generate import Rollout

# ----------------------------------------------------------------------------- verification on the paths


@dataclass
class _Path:
    """One rollout as the sampled verification reads it."""

    tokens: list[int]
    final: torch.Tensor          # [T, H] float32 final states
    target: PathTarget
    unit: Unit


def sampled_verify(targets: dict[int, PathTarget], units: Sequence[Unit], lm_head: torch.Tensor,
                   settings: EvalSampling) -> Callable[[list[Rollout]], VerifyRound]:
    """The `acceptance.Verifier` of a sampled eval (module docstring): rollouts carry their unit index as
    `prompt_index` (`sampled_prompts`); `targets` are `PathDraws.targets`. A window's paths are read once, for
    every k it is judged at."""
    def verifier(rollouts: list[Rollout]) -> VerifyRound:
        paths = [_Path(r.input_ids.tolist(), r.final_hidden_states.float(), targets[r.prompt_index],
                       units[r.prompt_index]) for r in rollouts]

        def verify(requests: list[tuple[int, int]], proposals: list[Any],
                   k: int) -> list[tuple[int, list[float] | None]]:
            return _verify_round(paths, requests, proposals, k, lm_head, settings)

        return verify

    return verifier


def _verify_round(paths: list[_Path], requests: list[tuple[int, int]], proposals: list[Any], k: int,
                  lm_head: torch.Tensor, settings: EvalSampling) -> list[tuple[int, list[float] | None]]:
    """Greedy drafts (token lists) and probabilistic ones (q logits `[k, V]` along the path) of one round.

    A greedy draft's expected acceptance at position m is the target's probability of its token there while the
    drafts before it held (0 past the first rejection): the probabilities of every drafted token inside its path
    are read in one product, then the count decides which of them count."""
    import torch  # heavy: only a sampled eval pays for it

    drafted = {n: list(proposal)[:k] for n, proposal in enumerate(proposals) if not isinstance(proposal, torch.Tensor)}
    inside = {n: min(len(drafts), len(paths[requests[n][0]].tokens) - requests[n][1]) for n, drafts in drafted.items()}
    wanted = [(requests[n][0], requests[n][1] + 1 + m, drafts[m]) for n, drafts in drafted.items()
              for m in range(inside[n])]
    probs = iter(_token_probs(paths, wanted, lm_head, settings) if wanted else [])
    out: list[tuple[int, list[float] | None]] = []
    for n, ((i, p), proposal) in enumerate(zip(requests, proposals, strict=True)):
        if n not in drafted:
            out.append(_verify_rows(paths[i], p, proposal, lm_head, settings))
            continue
        row = [next(probs) for _ in range(inside[n])]
        accepted = longest_prefix(drafted[n], paths[i].tokens[p + 1:p + 1 + k])
        out.append((accepted, [row[m] if m <= accepted and m < inside[n] else 0.0 for m in range(k)]))
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
