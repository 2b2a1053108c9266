"""Toy targets and drafts on tiny vocabularies, and the exact laws of speculative decoding over them.

The target is a trigram table (its next-token logits depend on the last two tokens); the draft is
DSpark-shaped: per-block base logits that depend on the anchor and the slot, plus a Markov bias of the
token drawn before (the anchor for the first slot), all float64, so every law here can be enumerated
exactly over all draft, acceptance and residual branches.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from dspark_hub.train.evaluation import sampled_acceptance as sa

#: `law(p_rows, q_rows, drafts)` -> branches (`sa.verification_law` or a broken twin of it).
Law = Callable[[torch.Tensor, torch.Tensor, Sequence[int]], list[sa.Branch]]


@dataclass
class Toy:
    vocab: int
    trigram: torch.Tensor        # [V + 1, V + 1, V] target logits; index V is "before the start"
    base: torch.Tensor           # [V, k, V] draft logits by anchor and slot
    markov: torch.Tensor         # [V, V] the draft's Markov bias by previous token
    k: int

    def target_logits(self, prefix: Sequence[int]) -> torch.Tensor:
        a, b = [self.vocab, self.vocab, *prefix][-2:]
        return self.trigram[a, b]

    def draft(self, anchor: int) -> sa.NextLogits:
        """The block's `next_logits`: base logits of the slot plus the Markov bias of the previous token."""
        def next_logits(drafted: Sequence[int]) -> torch.Tensor:
            prev = drafted[-1] if drafted else anchor
            return self.base[anchor, len(drafted)] + self.markov[prev]
        return next_logits


def make_toy(seed: int, vocab: int = 4, k: int = 2, *, likeness: float = 0.6, scale: float = 1.5) -> Toy:
    """A target and a draft that roughly imitates it (`likeness` of its logits in the base)."""
    g = torch.Generator().manual_seed(seed)
    trigram = scale * torch.randn(vocab + 1, vocab + 1, vocab, generator=g, dtype=torch.float64)
    base = scale * torch.randn(vocab, k, vocab, generator=g, dtype=torch.float64)
    base = base + likeness * trigram[vocab, :vocab, None, :]
    markov = scale * torch.randn(vocab, vocab, generator=g, dtype=torch.float64)
    return Toy(vocab, trigram, base, markov, k)


def _add(into: dict, key: object, weight: float) -> None:
    if weight:
        into[key] += weight


def draft_law(next_logits: sa.NextLogits, k: int, sampling: sa.Sampling, method: str
              ) -> list[tuple[float, list[int], torch.Tensor]]:
    """Every draft block `draw_drafts` can return, with its probability and q rows."""
    blocks: list[tuple[float, list[int], list[torch.Tensor]]] = [(1.0, [], [])]
    for _ in range(k):
        grown = []
        for weight, tokens, rows in blocks:
            q = sa.draft_probs(next_logits(tokens), sampling, method)
            grown += [(weight * float(q[x]), [*tokens, x], [*rows, q]) for x in range(len(q)) if q[x] > 0]
        blocks = grown
    return [(w, tokens, torch.stack(rows)) for w, tokens, rows in blocks]


def direct_block_law(toy: Toy, prefix: Sequence[int], sampling: sa.Sampling, method: str,
                     law: Law = sa.verification_law) -> dict[tuple[int, tuple[int, ...]], float]:
    """P(accepted = j, emitted = s) of one step run as vLLM runs it, anchored at `prefix[-1]`."""
    out: dict[tuple[int, tuple[int, ...]], float] = defaultdict(float)
    for weight, drafts, q_rows in draft_law(toy.draft(prefix[-1]), toy.k, sampling, method):
        p_rows = torch.stack([sa.target_probs(toy.target_logits([*prefix, *drafts[:i]]), sampling)
                              for i in range(toy.k + 1)])
        for branch in law(p_rows, q_rows, drafts):
            for x in range(toy.vocab):
                _add(out, (branch.accepted, (*drafts[:branch.accepted], x)),
                     weight * branch.weight * float(branch.next_token[x]))
    return out


def target_paths(toy: Toy, prefix: Sequence[int], length: int, sampling: sa.Sampling
                 ) -> list[tuple[float, tuple[int, ...]]]:
    """Every continuation of `length` tokens the target samples, with its probability."""
    paths: list[tuple[float, tuple[int, ...]]] = [(1.0, ())]
    for _ in range(length):
        grown = []
        for weight, path in paths:
            p = sa.target_probs(toy.target_logits([*prefix, *path]), sampling)
            grown += [(weight * float(p[x]), (*path, x)) for x in range(toy.vocab) if p[x] > 0]
        paths = grown
    return paths


def path_rows(toy: Toy, prefix: Sequence[int], path: Sequence[int], sampling: sa.Sampling, method: str
              ) -> sa.PathBlock:
    """The path view of the block anchored at `prefix[-1]` over the path's first k tokens."""
    p_rows = torch.stack([sa.target_probs(toy.target_logits([*prefix, *path[:i]]), sampling)
                          for i in range(toy.k)])
    q_rows = sa.path_q_rows(toy.draft(prefix[-1]), list(path[:toy.k]), sampling, method)
    return sa.path_block(p_rows, q_rows, torch.tensor(path[:toy.k]))


def path_block_law(toy: Toy, prefix: Sequence[int], sampling: sa.Sampling, method: str
                   ) -> dict[tuple[int, tuple[int, ...]], float]:
    """P(accepted = j, emitted = s) from target-sampled paths and the path view's acceptance."""
    out: dict[tuple[int, tuple[int, ...]], float] = defaultdict(float)
    for weight, path in target_paths(toy, prefix, toy.k + 1, sampling):
        acceptance = path_rows(toy, prefix, path, sampling, method).acceptance.tolist()
        reach = 1.0
        for j in range(toy.k + 1):
            stop = 1.0 - acceptance[j] if j < toy.k else 1.0
            _add(out, (j, path[:j + 1]), weight * reach * stop)
            reach *= acceptance[j] if j < toy.k else 1.0
    return out


def speculative_law(toy: Toy, prefix: Sequence[int], n: int, sampling: sa.Sampling, method: str,
                    law: Law = sa.verification_law) -> dict[tuple[int, ...], float]:
    """The law of the first `n` tokens the direct speculative loop emits after `prefix`."""
    out: dict[tuple[int, ...], float] = defaultdict(float)
    for (_, emitted), weight in direct_block_law(toy, prefix, sampling, method, law).items():
        if len(emitted) >= n:
            _add(out, emitted[:n], weight)
            continue
        for tail, more in speculative_law(toy, [*prefix, *emitted], n - len(emitted), sampling, method, law).items():
            _add(out, emitted + tail, weight * more)
    return out


def speculative_sample(toy: Toy, prefix: Sequence[int], n: int, sampling: sa.Sampling, method: str,
                       generator: torch.Generator, verify: Callable[..., tuple[int, list[int]]] = sa.verify_block
                       ) -> tuple[int, ...]:
    """The first `n` tokens of one run of the direct speculative loop (`draw_drafts`, `verify_block`)."""
    emitted: list[int] = []
    while len(emitted) < n:
        context = [*prefix, *emitted]
        drafts = sa.draw_drafts(toy.draft(context[-1]), toy.k, sampling, method, generator)
        p_rows = torch.stack([sa.target_probs(toy.target_logits([*context, *drafts.tokens[:i]]), sampling)
                              for i in range(toy.k + 1)])
        emitted += verify(p_rows, drafts.q_rows, drafts.tokens, generator)[1]
    return tuple(emitted[:n])


def distance(a: dict, b: dict) -> float:
    """The largest difference of two laws over the union of their outcomes."""
    return max(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in set(a) | set(b))


def chi_square_limit(df: int) -> float:
    """The 0.999 quantile of chi-square (Wilson-Hilferty; 37.84 for 15 degrees of freedom, exact 37.70)."""
    z = 3.0902323
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi_square(counts: Mapping, law: dict, n: int) -> float:
    return sum((counts.get(key, 0) - n * p) ** 2 / (n * p) for key, p in law.items())
