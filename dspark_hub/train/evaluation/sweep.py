"""`eval --k 1,2,...`: acceptance at every k in one run, each k counted as its own `eval --block-size k` counts.

What is shared: the target's rollouts (rolled out once, `max_new_tokens + max(k)` tokens, so every k's last
step can overshoot as in vLLM) and, per rollout, the draft's context (k3_dspark latents, speculators keys and
values: `drafters.sweep_drafter_for`). What is not: a DSpark block is drafted in one non-causal pass over its
k rows, so the drafts of a block of 7 are not the first drafts of a block of 5 (Model-Optimizer's profile
says the same of block-parallel methods: `accept_length_model: measured_per_k`), and each k's verify loop
takes its own path (a step that accepts j tokens moves the anchor j + 1 on). So every k has its own loops and
its own block forwards, run in lockstep: each round drafts one step of every unfinished request of every k.

`measure_sweep` hands each verification step to an `Observer` `(k, rollout, p, drafts, accepted)`:
acceptance by context length (`by_context`) and the confidence head's calibration (`calibration`) count
from the same steps.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from dspark_hub.documents import Document
from dspark_hub.errors import UsageError
from dspark_hub.progress import Progress
from dspark_hub.train.evaluation.acceptance import WINDOW, AcceptanceStats, Measurement, ProposeMany, VerifyLoop

if TYPE_CHECKING:
    from dspark_hub.train.evaluation.drafters import SweepDrafter
    from dspark_hub.train.target.generate import Rollout

#: `(k, rollout, anchor p, the drafts, how many were accepted)`: one verification step of one request.
Observer = Callable[[int, "Rollout", int, list[int], int], None]
#: The most k a sweep measures (each k is a verify loop and a block forward per step).
MAX_KS = 32
_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")


def parse_ks(text: str, *, block: int, param: str = "ks") -> list[int]:
    """`1,2,4`, `1-7`, `2-4,8` or `block` (1 to the draft's k) as a sorted list of distinct k.

    Raises:
        UsageError: an empty list, a k below 1, a range that runs down, or more than `MAX_KS` values.
    """
    ks: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if part == "block":
            ks.update(range(1, block + 1))
        elif part.isdigit():
            ks.add(int(part))
        elif m := _RANGE.match(part):
            low, high = int(m.group(1)), int(m.group(2))
            if low > high:
                raise UsageError(f"{part!r} runs down; write the smaller k first, e.g. {high}-{low}", param=param)
            ks.update(range(low, high + 1))
        else:
            raise UsageError(f"{part!r} is not a k; write e.g. 1,2,4 or 1-7 or block (1 to the draft's {block})",
                             param=param)
    if not ks or min(ks) < 1:
        raise UsageError(f"{text!r}: every k is a number of drafted tokens, 1 or more", param=param)
    if len(ks) > MAX_KS:
        raise UsageError(f"{text!r} names {len(ks)} k; measure at most {MAX_KS} in one run", param=param)
    return sorted(ks)


@dataclass
class KMeasurement(Document):
    """One k of a sweep: its counts (overall and per dataset) and the mean of each request's acceptance length."""

    KEYS = ("**measurement", "per_request_acceptance_length")

    measurement: Measurement
    request_lengths: list[float]

    @property
    def overall(self) -> AcceptanceStats:
        return self.measurement.overall

    @property
    def per_request_acceptance_length(self) -> float | None:
        """Model-Optimizer's `mean_accept_length_per_request`: every request weighs the same."""
        return sum(self.request_lengths) / len(self.request_lengths) if self.request_lengths else None


@dataclass
class Sweep(Document):
    """Acceptance at every k of `eval --k`, measured on the same rollouts in one run."""

    KEYS = ("ks", "shared", "by_k=rows")

    by_k: dict[int, KMeasurement]

    shared: ClassVar[str] = ("the target's rollouts and each rollout's draft context, once for every k; each k "
                             "drafts its own blocks and verifies on its own path")

    @property
    def ks(self) -> list[int]:
        return sorted(self.by_k)

    @property
    def rows(self) -> dict[str, KMeasurement]:
        return {str(k): self.by_k[k] for k in self.ks}

    def acceptance_lengths(self) -> dict[int, float]:
        return {k: self.by_k[k].overall.acceptance_length for k in self.ks}


def measure_sweep(rollouts: Iterable[Rollout], drafter: SweepDrafter, ks: Sequence[int],
                  progress: Progress | None = None, *, max_tokens: int | None = None, stop_ids: Iterable[int] = (),
                  window: int = WINDOW, observe: Observer | None = None) -> Sweep:
    """Every k's verify loops over the same rollouts, `window` rollouts at a time, in lockstep: each round drafts
    one step of every unfinished request of every k (one `propose_many` call per k). Each k's counts are those
    `acceptance.measure_batched` gives at that k alone."""
    stops, order = list(stop_ids), sorted(set(ks))
    overall = {k: AcceptanceStats(k) for k in order}
    by_dataset: dict[int, dict[str, AcceptanceStats]] = {k: {} for k in order}
    lengths: dict[int, list[float]] = {k: [] for k in order}
    pending = iter(rollouts)
    while chunk := list(itertools.islice(pending, window)):
        proposers = drafter(chunk, order)
        loops = {k: [VerifyLoop(r, k, max_tokens=max_tokens, stop_ids=stops) for r in chunk] for k in order}
        while _round(chunk, loops, proposers, observe):
            pass
        for k in order:
            for rollout, loop in zip(chunk, loops[k], strict=True):
                overall[k].add(loop.stats)
                if loop.stats.drafts:
                    lengths[k].append(loop.stats.acceptance_length)
                if rollout.dataset is not None:
                    by_dataset[k].setdefault(rollout.dataset, AcceptanceStats(k)).add(loop.stats)
        if progress:
            progress(len(chunk))
    return Sweep({k: KMeasurement(Measurement(overall[k], by_dataset[k]), lengths[k]) for k in order})


def _round(chunk: list[Rollout], loops: dict[int, list[VerifyLoop]], proposers: dict[int, ProposeMany],
           observe: Observer | None) -> bool:
    """One step of every unfinished request of every k; False once none is left."""
    stepped = False
    for k, these in loops.items():
        requests = [(i, p) for i, loop in enumerate(these) if (p := loop.anchor) is not None]
        if not requests:
            continue
        stepped = True
        for (i, p), drafts in zip(requests, proposers[k](requests), strict=True):
            these[i].step(drafts)
            if observe is not None:
                observe(k, chunk[i], p, drafts, these[i].p - p - 1)   # a step moves the anchor accepted + 1 on
    return stepped
