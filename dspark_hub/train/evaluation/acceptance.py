"""Acceptance with vLLM's definitions, simulated: the counts and the verify loop (the drafters: `drafters`).

The definitions (vLLM 0.32.0's spec-decoding metrics, `DEFINITION`): a *draft* is one verification
step of one request that carried `k` drafted tokens; `accepted_per_position[i]` counts the drafts
whose first `i + 1` tokens were all accepted; `per_position[i] = accepted_per_position[i] / drafts`;
`acceptance_length = 1 + sum(per_position) = 1 + accepted / drafts`, the mean number of tokens a
verification step emits (the 1 is the target's own token). `k` is the number of drafted tokens per
step.

`simulate` (`SIMULATION`) replays vLLM's greedy verify loop in plain PyTorch: the target's greedy
continuation of each prompt is the path vLLM emits (greedy speculative decoding is lossless). The
request starts at the token sampled at prefill, `x_P`; each step the draft proposes `k` tokens from
the target's taps of positions `< p` and the anchor `x_p` (its Markov head chained on its own
drafts); `j` = the longest prefix equal to the path; the step counts as one draft with `j`
accepted, IN FULL even when it crosses `max_tokens`; it emits `j + 1` tokens and the next anchor is
`x_{p+j+1}`. The request stops once it has `max_tokens` tokens or emitted a stop token.

A prompt-lookup drafter (n-gram copy, `BASELINE`, in `drafters`) runs through the same simulation on
the same paths, so a looping or degenerate dataset cannot pass for a good draft.

`measure_lanes` runs the loops of many rollouts in lockstep (`VerifyLoop`): every drafter of an eval (a
*lane*: the draft at each k of a sweep, a reference, the baseline) drafts one step of each unfinished
request per call, so a drafter can share work across requests; the counts are each request's own, and
each rollout's are kept (`Measurement.units`). How a round's drafts are judged is its `verify` (default
`exact_verify`, the greedy comparison above); a sampled eval passes vLLM's rejection sampling seen from
the target's sampled path (`sampled_eval`), which also gives each draft's expected acceptance
(`AcceptanceStats.expected_per_position`; under greedy decoding it is the count). `measure_batched` and
`measure_sweep` are its one-lane forms.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from dspark_hub.documents import Document
from dspark_hub.progress import Progress

if TYPE_CHECKING:
    from dspark_hub.train.target.generate import Rollout

DEFINITION = ("vLLM's spec-decoding metrics: drafts = verification steps that carried k drafted tokens; "
              "accepted_per_position[i] = drafts whose first i+1 tokens were all accepted; per_position[i] = "
              "accepted_per_position[i] / drafts; acceptance_length = 1 + sum(per_position) = 1 + accepted / drafts "
              "(mean tokens per verification step, the 1 being the target's own token)")
#: What the simulated numbers are, in a card's label: `simulated (<this>, k=K, float32, prompts F)`.
SIMULATION = "vLLM's greedy verify loop replayed on the target's float32 greedy path"
#: `propose_many([(i, p), ...])`: the drafts after position `p` of the i-th rollout, for each request (token
#: lists; a drafter of the probabilistic kind gives its q logits along the path instead: `sampled_eval`).
ProposeMany = Callable[[list[tuple[int, int]]], list[Any]]
#: `verify(requests, proposals, k)`: each request's (accepted drafts, expected acceptance per position or None
#: = the counts themselves) for one round at k; made once per window of rollouts (for every k) by a `Verifier`.
VerifyRound = Callable[[list[tuple[int, int]], list[Any], int], list[tuple[int, "list[float] | None"]]]
Verifier = Callable[[list["Rollout"]], VerifyRound]
#: rollouts -> propose_many: a drafter at one k (its requests drafted together, one call a round).
Drafter = Callable[[list["Rollout"]], ProposeMany]
#: (rollouts, ks) -> {k: propose_many}: the context of each rollout encoded once for every k.
SweepDrafter = Callable[[list["Rollout"], Sequence[int]], dict[int, ProposeMany]]
#: `(k, rollout, anchor p, the drafts, how many were accepted)`: one verification step of one request.
Observer = Callable[[int, "Rollout", int, Any, int], None]
#: Rollouts simulated together (their requests drafted in one call per round).
WINDOW = 64
BASELINE = ("prompt lookup (as transformers prompt_lookup_decoding): copy the K tokens that followed the earliest "
            "earlier occurrence of the last n = 3, 2, 1 tokens")


@dataclass
class AcceptanceStats(Document):
    """Counts of one decoding run, in vLLM's terms; merge runs by adding."""

    KEYS = ("acceptance_length", "per_position", "accepted_per_position", "drafts", "draft_tokens", "accepted", "k",
            "prompts", "tokens")

    k: int
    drafts: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    tokens: int = 0
    prompts: int = 0
    #: Per position, the sum over drafts of the probability the draft was accepted that far given the path
    #: before it (`sampled_acceptance.expected_prefix`); under greedy decoding the counts themselves.
    expected_per_position: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.k
        if not self.expected_per_position:
            self.expected_per_position = [0.0] * self.k

    def record(self, accepted: int, expected: Sequence[float] | None = None) -> None:
        """One draft of which the first `accepted` tokens were accepted (its expected acceptance per position,
        or None when it is the count itself)."""
        self.drafts += 1
        for i in range(accepted):
            self.accepted_per_position[i] += 1
        for i in range(self.k):
            self.expected_per_position[i] += float(i < accepted) if expected is None else float(expected[i])

    def add(self, other: AcceptanceStats) -> None:
        self.drafts += other.drafts
        self.accepted_per_position = [a + b for a, b in zip(self.accepted_per_position, other.accepted_per_position,
                                                              strict=True)]
        self.expected_per_position = [a + b for a, b in zip(self.expected_per_position, other.expected_per_position,
                                                              strict=True)]
        self.tokens += other.tokens
        self.prompts += other.prompts

    @property
    def expected_acceptance_length(self) -> float:
        """`1 + sum(expected_per_position) / drafts`: the expected acceptance length along these paths."""
        return 1.0 + sum(self.expected_per_position) / self.drafts if self.drafts else float("nan")

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_position)

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else float("nan")

    @property
    def per_position(self) -> list[float]:
        return [a / self.drafts if self.drafts else float("nan") for a in self.accepted_per_position]

    @property
    def draft_tokens(self) -> int:
        """Tokens drafted: `k` a draft."""
        return self.drafts * self.k


def longest_prefix(draft: list[int], truth: list[int]) -> int:
    j = 0
    while j < len(draft) and j < len(truth) and draft[j] == truth[j]:
        j += 1
    return j


class VerifyLoop:
    """vLLM's greedy verify loop over one rollout, one step at a time (`SIMULATION`).

    `anchor` is the position `p` the next step drafts after (None once the request is done);
    `step(drafts)` verifies the drafts for positions `p+1 ..` against the path and moves on.
    """

    def __init__(self, rollout: Rollout, k: int, *, max_tokens: int | None = None, stop_ids: Iterable[int] = ()):
        self.tokens: list[int] = rollout.input_ids.tolist()
        self.k = k
        start = rollout.prompt_length
        self.budget = len(self.tokens) - start if max_tokens is None else min(max_tokens, len(self.tokens) - start)
        self.stats = AcceptanceStats(k, prompts=1)
        self.stops = set(stop_ids)
        self.p = start
        self.emitted = 1 if self.budget > 0 else 0          # x_P is sampled at prefill
        self.stopped = self.emitted == 0 or self.tokens[start] in self.stops
        self.stats.tokens = self.emitted

    @property
    def anchor(self) -> int | None:
        return None if self.stopped or self.emitted >= self.budget else self.p

    def step(self, drafts: list[int]) -> None:
        """Verify `drafts` by vLLM's greedy rule: the longest prefix equal to the path."""
        self.step_accepted(longest_prefix(drafts[:self.k], self.tokens[self.p + 1:self.p + 1 + self.k]))

    def step_accepted(self, accepted: int, expected: Sequence[float] | None = None) -> None:
        """Record a step that accepted `accepted` drafts (with their expected acceptance, if sampled) and move on:
        the step emits the accepted path tokens and the target's next one."""
        p = self.p
        self.stats.record(accepted, expected)
        for token in self.tokens[p + 1:p + 2 + accepted]:       # the accepted drafts and the target's token
            if self.emitted >= self.budget:
                break
            self.emitted += 1
            if token in self.stops:
                self.stopped = True
                break
        self.p += accepted + 1
        self.stats.tokens = self.emitted


def simulate(rollout: Rollout, propose: Callable[[int], list[int]], k: int, *, max_tokens: int | None = None,
             stop_ids: Iterable[int] = ()) -> AcceptanceStats:
    """vLLM's greedy verify loop over one rollout, with `propose(p) -> drafts` (`SIMULATION`).

    Args:
        rollout: `input_ids` (prompt, then the greedy path) and `prompt_length`.
        propose: the drafter; `propose(p)` drafts the tokens after position `p`.
        k: drafted tokens per step.
        max_tokens: the request's output budget (default: the rollout's continuation). A path that
            does not reach `k` tokens past the budget compares the last steps with what it holds.
        stop_ids: tokens that end the request when emitted.
    """
    loop = VerifyLoop(rollout, k, max_tokens=max_tokens, stop_ids=stop_ids)
    while (p := loop.anchor) is not None:
        loop.step(propose(p))
    return loop.stats


@dataclass
class Measurement(Document):
    """Acceptance over a set of rollouts, overall and per dataset label; `units` holds each rollout's own counts
    (in the order measured), for intervals and paired comparisons (not part of this document)."""

    KEYS = ("**overall", "by_dataset=datasets")

    overall: AcceptanceStats
    by_dataset: dict[str, AcceptanceStats]
    units: list[AcceptanceStats] = field(default_factory=list)

    @property
    def datasets(self) -> dict[str, AcceptanceStats]:
        """`by_dataset`, its labels sorted."""
        return dict(sorted(self.by_dataset.items()))


def exact_verify(rollouts: list[Rollout]) -> VerifyRound:
    """vLLM's greedy verification (`SIMULATION`): each request's longest drafted prefix equal to the path."""
    tokens = [rollout.input_ids.tolist() for rollout in rollouts]

    def verify(requests: list[tuple[int, int]], proposals: list[Any], k: int) -> list[tuple[int, list[float] | None]]:
        return [(longest_prefix(drafts[:k], tokens[i][p + 1:p + 1 + k]), None)
                for (i, p), drafts in zip(requests, proposals, strict=True)]

    return verify


def one_k(drafter: Drafter, k: int) -> SweepDrafter:
    """A one-k drafter (rollouts -> propose_many) as a lane's drafter."""
    return lambda rollouts, ks: {k: drafter(rollouts)}


@dataclass(frozen=True)
class Lane:
    """One drafter of a lockstep pass: its name, how it drafts at each k, the k it is counted at, and who else is
    told of each of its verification steps."""

    name: str
    drafter: SweepDrafter
    ks: tuple[int, ...]
    observe: Observer | None = None


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


class _Tally:
    """One (lane, k)'s counts: overall, per dataset, each rollout's, and each request's acceptance length."""

    def __init__(self, k: int) -> None:
        self.overall = AcceptanceStats(k)
        self.by_dataset: dict[str, AcceptanceStats] = {}
        self.units: list[AcceptanceStats] = []
        self.lengths: list[float] = []

    def add(self, rollout: Rollout, stats: AcceptanceStats) -> None:
        self.overall.add(stats)
        self.units.append(stats)
        if stats.drafts:
            self.lengths.append(stats.acceptance_length)
        if rollout.dataset is not None:
            self.by_dataset.setdefault(rollout.dataset, AcceptanceStats(stats.k)).add(stats)

    def result(self) -> KMeasurement:
        return KMeasurement(Measurement(self.overall, self.by_dataset, self.units), self.lengths)


def measure_lanes(rollouts: Iterable[Rollout], lanes: Sequence[Lane], progress: Progress | None = None, *,
                  max_tokens: int | None = None, stop_ids: Iterable[int] = (), window: int = WINDOW,
                  verify: Verifier = exact_verify) -> dict[str, Sweep]:
    """Every lane's verify loops at each of its k over the same rollouts, `window` rollouts at a time, in lockstep:
    each round drafts one step of every unfinished request of every lane and k (one `propose_many` call each) and
    judges them with one `verify` call per lane and k (the window's judge made once, for every lane and k).
    Each lane's counts at a k are those of its drafter at that k alone; with `exact_verify` those of `simulate` on
    each rollout alone."""
    stops = list(stop_ids)
    keys = [(lane.name, k) for lane in lanes for k in sorted(set(lane.ks))]
    tallies = {key: _Tally(key[1]) for key in keys}
    watchers = {lane.name: lane.observe for lane in lanes}
    pending = iter(rollouts)
    while chunk := list(itertools.islice(pending, window)):
        proposers: dict[tuple[str, int], ProposeMany] = {}
        for lane in lanes:
            made = lane.drafter(chunk, sorted(set(lane.ks)))
            proposers.update({(lane.name, k): made[k] for k in lane.ks})
        judge = verify(chunk)
        loops = {key: [VerifyLoop(r, key[1], max_tokens=max_tokens, stop_ids=stops) for r in chunk] for key in keys}
        stepped = True
        while stepped:          # one round: a step of every unfinished request of every lane and k
            stepped = False
            for key, these in loops.items():
                requests = [(i, p) for i, loop in enumerate(these) if (p := loop.anchor) is not None]
                if not requests:
                    continue
                stepped, watch = True, watchers[key[0]]
                proposals = proposers[key](requests)
                for (i, p), drafts, (accepted, expected) in zip(requests, proposals,
                                                                 judge(requests, proposals, key[1]), strict=True):
                    these[i].step_accepted(accepted, expected)
                    if watch is not None:
                        watch(key[1], chunk[i], p, drafts, accepted)
        for key in keys:
            for rollout, loop in zip(chunk, loops[key], strict=True):
                tallies[key].add(rollout, loop.stats)
        if progress:
            progress(len(chunk))
    return {lane.name: Sweep({k: tallies[(lane.name, k)].result() for k in sorted(set(lane.ks))}) for lane in lanes}


def measure_sweep(rollouts: Iterable[Rollout], drafter: SweepDrafter, ks: Sequence[int],
                  progress: Progress | None = None, *, max_tokens: int | None = None, stop_ids: Iterable[int] = (),
                  window: int = WINDOW, observe: Observer | None = None) -> Sweep:
    """One drafter at every k of `ks` (`measure_lanes` with one lane)."""
    lane = Lane("draft", drafter, tuple(ks), observe)
    return measure_lanes(rollouts, [lane], progress, max_tokens=max_tokens, stop_ids=stop_ids,
                         window=window)["draft"]


def measure_batched(rollouts: Iterable[Rollout], make_batch_proposer: Drafter, k: int,
                    progress: Progress | None = None, *, max_tokens: int | None = None,
                    stop_ids: Iterable[int] = (), window: int = WINDOW, verify: Verifier = exact_verify
                    ) -> Measurement:
    """One drafter at one k (`measure_lanes` with one lane): `window` rollouts at a time in lockstep, each round
    drafting one step of every unfinished request with one `propose_many` call and judging them with one `verify`
    call. With `exact_verify` the counts are those of `simulate` on each rollout alone."""
    lane = Lane("draft", one_k(make_batch_proposer, k), (k,))
    return measure_lanes(rollouts, [lane], progress, max_tokens=max_tokens, stop_ids=stop_ids, window=window,
                         verify=verify)["draft"].by_k[k].measurement
