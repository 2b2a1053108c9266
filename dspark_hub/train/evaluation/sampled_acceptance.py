"""Sampled acceptance (temperature > 0) as vLLM 0.32.0 verifies drafts: pure torch, no I/O.

What each function reproduces of vLLM, with vLLM's file and function names, is in
docs/acceptance-sampling.md. In short:

- `Sampling`, `processed_logits`, `target_probs`: the target's sampling distribution p, vLLM's order
  (temperature, min-p, top-k, top-p) and its Triton kernel's tie rule.
- `draft_probs`: the draft's q as vLLM's rejection sampler reads it: one-hot at the argmax under
  `draft_sample_method="greedy"` (vLLM's default, at any temperature), `softmax(logits / T)` with no
  truncation under `"probabilistic"`.
- `draw_drafts`, `verify_block`, `verification_law`: one speculative step run as vLLM runs it (the
  drafts drawn from q with the Markov head chained on them, accept with min(1, p/q), the normalized
  residual on the first rejection, the bonus from p after k acceptances), sampled or as a law.
- `path_block`, `accepted_count`, `expected_prefix`: the same step seen from a path the target sampled
  on its own. Conditional on the token the step emitted at a position, the step accepted a draft there
  with probability `min(p, q)(x) / p(x) = min(1, q(x) / p(x))`, and an accepted draft equals the path
  token, so the draft's next q is chained on the path. The joint law of (emitted tokens, accepted
  counts) is the same as the direct loop's (tests/test_sampled_acceptance.py enumerates both), so
  `eval` can verify drafts on sampled target rollouts, and every draft compared on the same seed sees
  the same paths and the same acceptance uniforms (common random numbers).
- `stream_seed`, `make_generator`, `acceptance_uniforms`: one torch.Generator per (seed, prompt,
  sample, stream); vLLM's own streams (a counter-based hash of seed and position) are not replayed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dspark_hub.errors import UsageError

if TYPE_CHECKING:
    import torch

#: vLLM's `speculative_config.draft_sample_method`: "greedy" (its default) drafts the argmax at any
#: temperature and verifies it as a one-hot q; "probabilistic" draws each draft from softmax(logits / T).
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
#: `next_logits(drafted)`: the draft's raw (pre-temperature) logits over the TARGET's vocabulary for the
#: next draft position of the current block, given the tokens drafted in it so far (the anchor is the
#: callable's own; a pruned draft vocabulary is scattered into target ids with -inf elsewhere, as
#: vLLM's `DSparkSpeculator._sample_logits` does).
NextLogits = Callable[[Sequence[int]], "torch.Tensor"]
#: The random streams of one (prompt, sample): the target's sampled continuation, the acceptance
#: uniforms of the path view, and the direct loop's draft draws and verification.
STREAMS = ("path", "accept", "draft", "verify")


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters that shape the target's distribution, as vLLM's `SamplingParams` takes them.

    `top_k` <= 0 (or >= the vocabulary) and `top_p` = 1 turn truncation off; temperature 0 is greedy.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UsageError(f"{self.temperature} is not a temperature; pass 0 (greedy) or a positive number",
                             param="temperature")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"{self.top_p} is outside (0, 1]; pass 1 to keep the whole distribution",
                             param="top_p")
        if not 0 <= self.min_p <= 1:
            raise UsageError(f"{self.min_p} is outside [0, 1]; pass 0 to turn min-p off", param="min_p")
        if self.greedy and self.truncated:
            raise UsageError("top-k, top-p and min-p need a temperature above 0 (vLLM ignores them when greedy)",
                             param="temperature")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def truncated(self) -> bool:
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0

    def describe(self) -> str:
        """`temperature 1.0, top-p 0.9, top-k 50, min-p 0.05`, or `greedy`; the parts that are on."""
        if self.greedy:
            return "greedy"
        parts = [f"temperature {self.temperature:g}"]
        parts += [f"top-p {self.top_p:g}"] if self.top_p < 1 else []
        parts += [f"top-k {self.top_k}"] if self.top_k > 0 else []
        parts += [f"min-p {self.min_p:g}"] if self.min_p > 0 else []
        return ", ".join(parts)


def _working_dtype(logits: torch.Tensor) -> torch.dtype:
    """float32 as vLLM (`Sampler.apply_sampling_params` copies to float32); float64 stays float64."""
    import torch  # heavy: only a sampled measurement pays for it

    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def processed_logits(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The target's logits after `sampling`, in vLLM's order; removed tokens are -inf.

    vLLM 0.32.0, Model Runner V2 (`v1/worker/gpu/sample/sampler.py:Sampler.apply_sampling_params`):
    divide by the temperature, min-p (drop `logit < max + log(min_p)`), then top-k and top-p in one
    Triton kernel (`v1/sample/ops/topk_topp_triton.py`): top-k keeps exactly k tokens, top-p then
    keeps the fewest of those, renormalized, whose mass reaches p. Order is logit descending, lower
    token id first among equal logits (the kernel's duplicate rule).

    Args:
        logits: `[..., V]` raw target logits.
        sampling: not greedy (`target_probs` takes the argmax for greedy).
    """
    import torch  # heavy: only a sampled measurement pays for it

    if sampling.greedy:
        raise ValueError("processed_logits: greedy sampling has no processed distribution; use target_probs")
    x = logits.to(_working_dtype(logits))
    if sampling.temperature != 1.0:
        x = x / sampling.temperature
    if sampling.min_p > 0:
        x = x.masked_fill(x < x.amax(dim=-1, keepdim=True) + math.log(sampling.min_p), -math.inf)
    vocab = x.shape[-1]
    top_k = sampling.top_k if 0 < sampling.top_k < vocab else 0
    if not top_k and sampling.top_p >= 1:
        return x
    ranked, order = torch.sort(x, dim=-1, descending=True, stable=True)    # stable: lower id first on ties
    keep = torch.isfinite(ranked)
    if top_k:
        keep &= torch.arange(vocab, device=x.device) < top_k
    if sampling.top_p < 1:
        probs = torch.softmax(ranked.masked_fill(~keep, -math.inf), dim=-1)
        mass_before = torch.cumsum(probs, dim=-1).roll(1, dims=-1)
        mass_before[..., 0] = 0.0
        keep &= mass_before < sampling.top_p
    return torch.empty_like(x).scatter_(-1, order, ranked.masked_fill(~keep, -math.inf))


def one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    """The point mass at the argmax (the lowest id among equal maxima, as torch and vLLM's kernels)."""
    import torch  # heavy: only a sampled measurement pays for it

    dtype = _working_dtype(logits)
    return torch.zeros(logits.shape, dtype=dtype, device=logits.device).scatter_(
        -1, logits.argmax(dim=-1, keepdim=True), 1.0)


def target_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """p: the distribution vLLM samples the target from (greedy: the point mass at the argmax)."""
    import torch  # heavy: only a sampled measurement pays for it

    if sampling.greedy:
        return one_hot_argmax(logits)
    return torch.softmax(processed_logits(logits, sampling), dim=-1)


def draft_probs(logits: torch.Tensor, sampling: Sampling, method: str = "greedy") -> torch.Tensor:
    """q: the draft's distribution as vLLM's rejection sampler reads it.

    `method` is vLLM's `draft_sample_method`. "greedy" (vLLM's default) or temperature 0: the point
    mass at the argmax of the raw logits (`DSparkSpeculator._sample_logits` takes `logits.argmax`
    and the rejection kernels treat q as one-hot). "probabilistic": `softmax(logits / T)` over the
    whole vocabulary: vLLM applies the request's temperature to drafts but never its top-k, top-p or
    min-p (`DraftModelSpeculator._copy_request_inputs`), and the rejection kernels divide the cached
    raw draft logits by the same temperature.
    """
    import torch  # heavy: only a sampled measurement pays for it

    if method not in DRAFT_SAMPLE_METHODS:
        raise UsageError(f"{method!r} is not one of vLLM's draft_sample_method values "
                         f"({', '.join(DRAFT_SAMPLE_METHODS)})", param="draft_sample_method")
    if method == "greedy" or sampling.greedy:
        return one_hot_argmax(logits)
    return torch.softmax(logits.to(_working_dtype(logits)) / sampling.temperature, dim=-1)


def sample_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn from `probs` (`[V]`, any positive mass; a point mass returns its token)."""
    import torch  # heavy: only a sampled measurement pays for it

    return int(torch.multinomial(probs, 1, generator=generator))


def uniform(generator: torch.Generator) -> float:
    import torch  # heavy: only a sampled measurement pays for it

    return float(torch.rand((), dtype=torch.float64, generator=generator))


# -- one speculative step, run as vLLM runs it -------------------------------------------------------

def accept_probability(p: torch.Tensor, q: torch.Tensor, token: int) -> float:
    """min(1, p(x) / q(x)) for a draft x drawn from q (vLLM: accept iff `log p(x) > log u + log q(x)`)."""
    drawn = float(q[token])
    if drawn <= 0:
        raise ValueError(f"accept_probability: draft token {token} has probability 0 under the draft's own q")
    return min(1.0, float(p[token]) / drawn)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)): what vLLM resamples from on a rejection (`_resample_kernel`).

    With q one-hot at the rejected draft this is p with that token removed. When p == q a rejection
    has probability 0 and the residual is never drawn; p is returned so the result stays a distribution.
    """
    import torch  # heavy: only a sampled measurement pays for it

    left = torch.clamp(p - q, min=0.0)
    mass = float(left.sum())
    return left / mass if mass > 0 else p


@dataclass(frozen=True)
class Drafts:
    """One block of drafts and the q each was drawn from."""

    tokens: list[int]
    q_rows: torch.Tensor     # [k, V]


def draw_drafts(next_logits: NextLogits, k: int, sampling: Sampling, method: str,
                generator: torch.Generator) -> Drafts:
    """k drafts as vLLM's DSpark speculator draws them (`DSparkSpeculator._sample_sequential`).

    Draft i is drawn from `q_i = draft_probs(next_logits(drafts[:i]))`: the block's logits plus the
    Markov bias of the token drawn before it (the anchor for the first), so the head is chained on the
    drawn tokens. Greedy drafting (or temperature 0) takes the argmax and draws nothing from `generator`.
    """
    import torch  # heavy: only a sampled measurement pays for it

    tokens: list[int] = []
    rows = []
    for _ in range(k):
        q = draft_probs(next_logits(tokens), sampling, method)
        rows.append(q)
        tokens.append(int(q.argmax()) if method == "greedy" or sampling.greedy else sample_token(q, generator))
    return Drafts(tokens, torch.stack(rows))


def verify_block(p_rows: torch.Tensor, q_rows: torch.Tensor, drafts: Sequence[int],
                 generator: torch.Generator) -> tuple[int, list[int]]:
    """One verification step as vLLM's rejection sampler runs it; returns (accepted, emitted tokens).

    For each draft x_i in order, u ~ U[0, 1): accept iff u < min(1, p_i(x_i) / q_i(x_i)). The first
    rejection at i emits a token from `residual(p_i, q_i)`; after all k acceptances the bonus token is
    drawn from `p_rows[k]` (`_rejection_kernel`, `_resample_kernel`, `_insert_resampled_kernel`).

    Args:
        p_rows: `[k + 1, V]` the target's p at the k draft positions and the bonus position, each
            conditioned on the drafts before it.
        q_rows: `[k, V]` the q each draft was drawn from.
        drafts: the k drafted tokens.
    """
    for i, token in enumerate(drafts):
        if not uniform(generator) < accept_probability(p_rows[i], q_rows[i], token):
            return i, [*drafts[:i], sample_token(residual(p_rows[i], q_rows[i]), generator)]
    return len(drafts), [*drafts, sample_token(p_rows[len(drafts)], generator)]


@dataclass(frozen=True)
class Branch:
    """One outcome of a verification step: `weight` = P(exactly `accepted` drafts accepted); the token
    emitted after them is drawn from `next_token` (the residual on a rejection, p on the bonus)."""

    weight: float
    accepted: int
    next_token: torch.Tensor


def verification_law(p_rows: torch.Tensor, q_rows: torch.Tensor, drafts: Sequence[int]) -> list[Branch]:
    """The exact law `verify_block` samples from, for exact enumeration (k + 1 branches)."""
    branches = []
    reach = 1.0
    for i, token in enumerate(drafts):
        accept = accept_probability(p_rows[i], q_rows[i], token)
        branches.append(Branch(reach * (1.0 - accept), i, residual(p_rows[i], q_rows[i])))
        reach *= accept
    branches.append(Branch(reach, len(drafts), p_rows[len(drafts)]))
    return branches


# -- the same step on a path the target sampled ------------------------------------------------------

def path_q_rows(next_logits: NextLogits, path: Sequence[int], sampling: Sampling, method: str) -> torch.Tensor:
    """`[k, V]` the draft's q at the block's k positions, the Markov head chained on the path's tokens
    (an accepted draft equals the path token, and nothing after a rejection is used)."""
    import torch  # heavy: only a sampled measurement pays for it

    return torch.stack([draft_probs(next_logits(path[:i]), sampling, method) for i in range(len(path))])


@dataclass(frozen=True)
class PathBlock:
    """A block verified on the target's own path: for each of its k positions,

    - `acceptance[i]` = P(the draft was accepted | the step emitted the path token x_i)
      = min(1, q_i(x_i) / p_i(x_i)) (1 or 0 when q is one-hot: greedy drafting is a comparison);
    - `overlap[i]` = sum_x min(p_i(x), q_i(x)): P(the draft is accepted | the tokens before it).
    """

    acceptance: torch.Tensor   # [..., k]
    overlap: torch.Tensor      # [..., k]


def path_block(p_rows: torch.Tensor, q_rows: torch.Tensor, path: torch.Tensor) -> PathBlock:
    """`PathBlock` of `[..., k, V]` p and q rows along `[..., k]` path tokens (batched freely)."""
    import torch  # heavy: only a sampled measurement pays for it

    index = path.long().unsqueeze(-1)
    p_token = p_rows.gather(-1, index).squeeze(-1)
    q_token = q_rows.gather(-1, index).squeeze(-1)
    if bool((p_token <= 0).any()):
        raise ValueError("path_block: a path token has probability 0 under the target's p: the path was not "
                         "sampled with these sampling parameters")
    return PathBlock(acceptance=torch.clamp(q_token / p_token, max=1.0),
                     overlap=torch.minimum(p_rows, q_rows).sum(dim=-1))


def accepted_count(acceptance: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Drafts accepted in each block: the longest prefix with `u_i < acceptance_i` (`[..., k]` -> `[...]`)."""
    import torch  # heavy: only a sampled measurement pays for it

    return torch.cumprod((uniforms < acceptance).long(), dim=-1).sum(dim=-1)


def expected_prefix(block: PathBlock) -> torch.Tensor:
    """`[..., k]`: the expected value of "the first i + 1 drafts were accepted" given the path before
    position i, `acceptance[0] * ... * acceptance[i-1] * overlap[i]`.

    Unbiased for vLLM's per-position acceptance (summed over a run's drafts and divided by its drafts,
    it estimates `per_position`), with the last position's coin and token integrated out, so its
    variance is lower than the counts'. The product of the overlaps alone along the path is NOT
    unbiased: the tokens the path holds are distributed as p, the tokens an accepted draft holds as
    min(p, q) / overlap (tests/test_sampled_acceptance.py shows the difference).
    """
    import torch  # heavy: only a sampled measurement pays for it

    before = torch.cumprod(block.acceptance, dim=-1).roll(1, dims=-1)
    before[..., 0] = 1.0
    return before * block.overlap


# -- random streams ----------------------------------------------------------------------------------

def stream_seed(seed: int, prompt_key: str, sample: int, stream: str) -> int:
    """A 63-bit seed for one stream of one (prompt, sample): SHA-256 of the four, so a stream depends
    on the prompt's key (e.g. the SHA-256 of its token ids), not on its order or batch."""
    if stream not in STREAMS:
        raise ValueError(f"stream_seed: {stream!r} is not one of {', '.join(STREAMS)}")
    digest = hashlib.sha256(f"{seed}\0{prompt_key}\0{sample}\0{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def make_generator(seed: int, prompt_key: str, sample: int, stream: str) -> torch.Generator:
    """A CPU torch.Generator for one stream of one (prompt, sample) (`stream_seed`)."""
    import torch  # heavy: only a sampled measurement pays for it

    generator = torch.Generator()
    generator.manual_seed(stream_seed(seed, prompt_key, sample, stream))
    return generator


def acceptance_uniforms(seed: int, prompt_key: str, sample: int, length: int) -> torch.Tensor:
    """`[length]` float64 uniforms, one per path position: the path view's acceptance coins.

    A position is verified at most once per run, so one uniform per position is enough; every draft
    measured with the same seed reads the same uniforms (common random numbers for paired comparisons).
    """
    import torch  # heavy: only a sampled measurement pays for it

    return torch.rand(length, dtype=torch.float64, generator=make_generator(seed, prompt_key, sample, "accept"))
