"""`eval --by-context`: acceptance per bucket of context length at the draft's anchor.

A verification step drafts after the anchor `x_p`; its context length is `p + 1`, the tokens the request
holds then (prompt and everything emitted so far, the anchor included), what a serving engine's KV cache
holds for it. Each step is counted in the bucket of its context length, with vLLM's definitions
(`acceptance.DEFINITION`), overall and per dataset. Buckets are `[1, e1)`, `[e1, e2)`, ..., `[en, inf)`
for the edges `e1 < ... < en`: given, or powers of two from 64 up to the longest context seen.

A draft that attends to a sliding window, or was trained on shorter sequences, keeps its acceptance up to a
length and loses it past there (a DFlash draft served with full instead of sliding attention fell off after
2K tokens; the Kimi-K3-DSpark Hub discussion reports a cliff between about 107K and 196K): the rows show
where. `card` renders them as the card's `long_context` table.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from dspark_hub.documents import Document
from dspark_hub.errors import UsageError
from dspark_hub.train.evaluation.acceptance import AcceptanceStats

if TYPE_CHECKING:
    from dspark_hub.train.target.generate import Rollout

#: The first automatic edge; the next ones double it.
FIRST_EDGE = 64
#: The name of the row that counts every prompt.
ALL = "all prompts"


def parse_edges(text: str, *, param: str = "context_edges") -> list[int]:
    """`1024,4096,16384` as increasing bucket edges.

    Raises:
        UsageError: not positive integers in increasing order.
    """
    try:
        edges = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise UsageError(f"{text!r} is not a list of context lengths, e.g. 1024,4096,16384", param=param) from None
    if not edges or edges[0] < 2 or any(b <= a for a, b in itertools.pairwise(edges)):
        raise UsageError(f"{text!r}: the edges are context lengths above 1, in increasing order", param=param)
    return edges


def automatic_edges(longest: int) -> list[int]:
    """Powers of two from `FIRST_EDGE`, the last one at or below `longest` (none for shorter contexts)."""
    edges, edge = [], FIRST_EDGE
    while edge <= longest:
        edges.append(edge)
        edge *= 2
    return edges


def bucket_label(low: int, high: int | None) -> str:
    """`64-127`, or `1024+` for the last, open bucket."""
    return f"{low:,}+" if high is None else f"{low:,}-{high - 1:,}"


@dataclass
class ContextRow(Document):
    """Acceptance of the verification steps of one dataset (or all) whose context length is in one bucket."""

    KEYS = ("dataset", "context", "context_from", "context_to", "drafts", "acceptance_length", "per_position",
            "accepted_per_position")

    dataset: str
    context_from: int
    context_to: int | None          # exclusive; None: no upper end
    stats: AcceptanceStats

    @property
    def context(self) -> str:
        return bucket_label(self.context_from, self.context_to)

    @property
    def drafts(self) -> int:
        return self.stats.drafts

    @property
    def acceptance_length(self) -> float:
        return self.stats.acceptance_length

    @property
    def per_position(self) -> list[float]:
        return self.stats.per_position

    @property
    def accepted_per_position(self) -> list[int]:
        return self.stats.accepted_per_position


@dataclass
class ByContext(Document):
    """`eval --by-context`: acceptance per context-length bucket, all prompts first, then each dataset."""

    KEYS = ("k", "definition", "edges", "rows")

    k: int
    edges: list[int]
    rows: list[ContextRow]

    definition: ClassVar[str] = ("a verification step's context length is p + 1 at its anchor x_p (the tokens the "
                                 "request holds: prompt, emitted tokens, the anchor); buckets [1, e1), [e1, e2), ..., "
                                 "[en, inf); acceptance in vLLM's definitions over the steps of each bucket")


@dataclass
class ContextTally:
    """Counts the verification steps of one k per (dataset, bucket): an `Observer` of `serving.measure_lanes`.

    With no `edges`, every step is kept by its context length and bucketed at the end (`automatic_edges`).
    """

    k: int
    edges: list[int] | None = None
    steps: dict[tuple[str, int], AcceptanceStats] = field(default_factory=dict)   # (dataset, length) -> counts

    def __call__(self, k: int, rollout: Rollout, p: int, drafts: Sequence[int], accepted: int) -> None:
        if k != self.k:
            return
        for name in (ALL, rollout.dataset) if rollout.dataset is not None else (ALL,):
            self.steps.setdefault((name, p + 1), AcceptanceStats(k)).record(accepted)

    def result(self) -> ByContext:
        longest = max((length for _, length in self.steps), default=0)
        edges = self.edges if self.edges is not None else automatic_edges(longest)
        bounds = [1, *edges]
        rows: dict[tuple[str, int], AcceptanceStats] = {}
        for (name, length), stats in self.steps.items():
            bucket = bisect.bisect_right(edges, length)
            rows.setdefault((name, bucket), AcceptanceStats(self.k)).add(stats)
        ordered = sorted(rows, key=lambda key: (key[0] != ALL, key[0], key[1]))
        return ByContext(self.k, list(edges), [
            ContextRow(name, bounds[bucket], edges[bucket] if bucket < len(edges) else None, rows[(name, bucket)])
            for name, bucket in ordered])
