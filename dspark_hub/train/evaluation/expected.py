"""Expected accepted drafts per anchor, teacher-forced on the target's greedy paths: the low-noise paired measure.

At every anchor `p` of a greedy path the draft is run as a server would run it, on the target's states of the
positions before `p`: the block `[x_p, M, ..., M]`, its Markov head chained on the path's own tokens, its
vocabulary map. With `q_i` the probability the draft gives the path's token `i` places after the anchor, the
value at that anchor is `sum_i prod_{j <= i} q_j`: the drafts a step would accept if each slot were sampled from
the draft and verified against the greedy path. It uses every anchor and the draft's whole distribution, not
only its argmax, so two ways of serving the same draft, measured on the same anchors, differ by far less noise
than their greedy acceptance (`Paired`: the mean difference per anchor and its standard error).

How the draft is served is a `Reading`: the taps it is fed (and whether the last one passed the target's final
norm), how many tokens its block is run for, whether its Markov head is added, and, per format, the speculators
slot layout and `d2t` reading or the k3_dspark RoPE pairing. `Scorer` runs readings of one draft on `GreedyPath`s
(a path's tokens with the target's states at every layer any reading taps, captured once): readings that share
the body's forward share it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from dspark_hub.documents import Document
from dspark_hub.format.registry import K3, SPECULATORS
from dspark_hub.progress import Progress

if TYPE_CHECKING:
    import torch

    from dspark_hub.modeling import K3DSparkModel
    from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark
    from dspark_hub.train.evaluation.inputs import DraftUnderTest
    from dspark_hub.train.target.target import Target

D2tReading = Literal["offsets", "absolute"]
RopePairing = Literal["interleaved", "half-split"]
#: Anchors per consecutive run whose values are averaged before the spread is taken (`Paired`).
RUN = 16


@dataclass
class GreedyPath:
    """One greedy path: its tokens and the target's states at every layer a reading may tap.

    `layers[l]` is the output of target layer `l` (our convention: before the final norm, as vLLM and forward
    hooks capture it), `final` the final-normed state (what transformers' `hidden_states[-1]` gives).
    """

    prompt_index: int
    input_ids: torch.Tensor            # [T] int64
    prompt_length: int
    layers: dict[int, torch.Tensor]    # layer id -> [T, H] float32
    final: torch.Tensor                # [T, H] float32

    def taps(self, layer_ids: Sequence[int], *, normed_last: bool = False) -> torch.Tensor:
        """`[T, n*H]`: the states of `layer_ids` concatenated in ascending order (the last one final-normed)."""
        import torch

        states = [self.layers[layer] for layer in sorted(layer_ids)]
        if normed_last:
            states[-1] = self.final
        return torch.cat(states, dim=-1)

    def anchors(self, k: int) -> range:
        """Anchors whose `k` path tokens the path holds: the continuation's first token onwards."""
        return range(self.prompt_length, len(self.input_ids) - k)


@dataclass(frozen=True)
class Reading:
    """How a draft is served: every knob a convention turns.

    `block` is the number of tokens the block is run for (the served k, or a block size being tried) and
    `positions` how many of its slots are scored (at most `block`). `sample_from_anchor` None keeps the
    speculators config's value.
    """

    taps: tuple[int, ...]
    block: int
    positions: int
    normed_last_tap: bool = False
    markov: bool = True
    sample_from_anchor: bool | None = None
    d2t: D2tReading = "offsets"
    rope: RopePairing = "interleaved"
    untrained: bool = False            # the draft's trained weights replaced by `init`'s (the untrained level)

    def body(self) -> tuple[Any, ...]:
        """What the body's forward depends on: readings with the same key share it."""
        return (self.taps, self.normed_last_tap, self.block, self.sample_from_anchor, self.rope, self.untrained)


def expected_accepted(q: torch.Tensor) -> torch.Tensor:
    """`[anchors, k]` slot probabilities -> `[anchors]` float64 `sum_i prod_{j <= i} q_j`."""
    import torch

    return torch.cumprod(q.double(), dim=-1).sum(-1)


@dataclass(frozen=True)
class Paired(Document):
    """`b - a` per anchor, over the same anchors of the same paths: its mean and standard error.

    The standard error treats runs of `RUN` consecutive anchors of a path as the independent units (batch
    means): a path's neighbouring anchors read almost the same context, so their differences are correlated,
    and the spread of single anchors would understate the error.
    """

    KEYS = ("difference=mean", "standard_error", "z=finite_z", "units")
    mean: float
    standard_error: float
    units: int

    @property
    def z(self) -> float:
        """The mean in standard errors (0 when both are 0: identical at every anchor; +-inf when only the
        error is 0)."""
        if self.standard_error > 0:
            return self.mean / self.standard_error
        return 0.0 if self.mean == 0 else math.copysign(math.inf, self.mean)

    @property
    def identical(self) -> bool:
        return self.mean == 0 and self.standard_error == 0

    @property
    def finite_z(self) -> float | None:
        """`z` where it is finite (JSON has no infinity)."""
        return self.z if math.isfinite(self.z) else None


def paired(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], run: int = RUN) -> Paired:
    """The paired difference `b - a` of two measurements, each a list of per-anchor values, one per path."""
    import torch

    means, weights = [], []
    for path_a, path_b in zip(a, b, strict=True):
        diff = (path_b - path_a).double()
        for start in range(0, len(diff), run):
            chunk = diff[start:start + run]
            means.append(float(chunk.mean()))
            weights.append(len(chunk))
    if not means:
        raise ValueError("no anchors: a paired difference needs at least one")
    values, w = torch.tensor(means, dtype=torch.float64), torch.tensor(weights, dtype=torch.float64)
    mean = float((values * w).sum() / w.sum())
    n = len(means)
    if n < 2:
        return Paired(mean, 0.0 if mean == 0 else math.inf, n)
    # a weighted mean of unit means: its variance from the units' weighted residuals (n / (n - 1) correction)
    residual = (w * (values - mean)) / w.sum()
    variance = float(n / (n - 1) * (residual ** 2).sum())
    return Paired(mean, math.sqrt(variance), n)


def mean_value(values: Sequence[torch.Tensor]) -> float:
    """The mean per anchor over every path."""
    import torch

    return float(torch.cat(list(values)).mean())


# ----------------------------------------------------------------------------- the scorer


@dataclass
class Scorer:
    """Readings of one draft, run on greedy paths; the target's `lm_head` loaded once, each weight variant of the
    draft (the RoPE pairing, the untrained level) once."""

    draft: DraftUnderTest
    target: Target
    lm_head: torch.Tensor
    _models: dict[tuple[str, bool], Any] = field(default_factory=dict)

    @classmethod
    def open(cls, draft: DraftUnderTest, target: Target) -> Scorer:
        return cls(draft, target, target.lm_head().float())

    def declared(self) -> Reading:
        """The reading the config declares: its taps, its served k, every convention as the format says."""
        return Reading(tuple(self.draft.taps), self.draft.k, self.draft.k)

    def slot_values(self, paths: Sequence[GreedyPath], readings: Sequence[Reading],
                    progress: Progress | None = None) -> dict[Reading, list[torch.Tensor]]:
        """Per reading, per path, `[anchors, positions]` slot probabilities (`expected_accepted` sums them).

        Every reading is scored on the same anchors, those of the largest `block` asked for, so all readings
        pair. Readings that share the body's forward (`Reading.body`) share it, and the vocabulary projection of
        their first slot; the projections run over the anchors of every path together, `CHUNK` rows at a time.
        `progress` is called with the readings scored, one forward of the body at a time.
        """
        import torch

        longest = max(r.block for r in readings)
        anchors = [list(path.anchors(longest)) for path in paths]
        sizes = [len(a) for a in anchors]
        by_body: dict[tuple[Any, ...], list[Reading]] = {}
        for reading in readings:
            by_body.setdefault(reading.body(), []).append(reading)
        runner = RUNNERS[self.draft.format.name]
        out: dict[Reading, list[torch.Tensor]] = {}
        with torch.no_grad():
            for group in by_body.values():
                model = self._model(runner, group[0])
                head = runner.head(model, paths, anchors, group[0], self.lm_head)
                for reading, q in zip(group, head.score(group), strict=True):
                    out[reading] = list(q.split(sizes))
                if progress is not None:
                    progress(len(group))
        return out

    def _model(self, runner: Runner, reading: Reading) -> Any:
        key = (reading.rope, reading.untrained)
        if key not in self._models:
            self._models[key] = runner.load(self, reading)
        return self._models[key]


# ----------------------------------------------------------------------------- the untrained level

#: Tensors `init --target` copies from the target (or derives from its vocabulary) instead of drawing at random.
K3_FROM_TARGET = frozenset({"embed_tokens.weight"})
SPECULATORS_FROM_TARGET = frozenset({"lm_head.weight", "d2t", "t2d"})


def untrained_like(tensors: Mapping[str, torch.Tensor], *, keep: frozenset[str], seed: int = 0
                   ) -> dict[str, torch.Tensor]:
    """`tensors` as `init` would write them untrained: norms ones, biases zeros, matrices N(0, 0.02) (seeded),
    the tensors in `keep` (copied from the target by `init`) and integer tensors as they are."""
    import torch

    from dspark_hub.ops.init import INIT_STD

    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(tensors):
        tensor = tensors[name]
        if name in keep or not tensor.is_floating_point():
            out[name] = tensor
        elif name.endswith("norm.weight"):
            out[name] = torch.ones_like(tensor)
        elif name.endswith(".bias"):
            out[name] = torch.zeros_like(tensor)
        else:
            out[name] = torch.empty(tensor.shape).normal_(0.0, INIT_STD, generator=generator).to(tensor.dtype)
    return out


# ----------------------------------------------------------------------------- k3_dspark


def _load_k3(scorer: Scorer, reading: Reading) -> K3DSparkModel:
    import torch

    from dspark_hub.modeling import load_checkpoint

    model: K3DSparkModel = load_checkpoint(scorer.draft.path, dtype=torch.float32).model
    model.train(False)
    if reading.untrained:
        state = model.state_dict()
        fresh = untrained_like({n: t for n, t in state.items() if n in dict(model.named_parameters())},
                               keep=K3_FROM_TARGET)
        model.load_state_dict({**state, **fresh})
    if reading.rope == "half-split":
        model = half_split_rope(model)
    return model


def rope_rows(half: int) -> list[int]:
    """The interleaved order of a half-split RoPE block of `2 * half` channels: row `2i` is channel `i`, row
    `2i + 1` channel `half + i`."""
    return [c for i in range(half) for c in (i, half + i)]


def half_split_rope(model: K3DSparkModel) -> K3DSparkModel:
    """A copy of `model` that computes, with the contract's interleaved RoPE, what `model`'s weights compute
    under half-split RoPE (rotate-half pairs `(i, i + d/2)`, transformers' Llama layout).

    Rotating the pairs `(i, i + d/2)` of `x` equals rotating the pairs `(2i, 2i + 1)` of `x` reordered by
    `rope_rows`, and attention scores are dot products of query and key, which one reordering of both leaves
    unchanged: so reordering the rope rows of the query and key projections is serving the weights half-split.
    """
    import torch

    variant = copy.deepcopy(model)
    config = variant.config
    rope, nope = config.qk_rope_head_dim, config.qk_nope_head_dim
    order = torch.tensor(rope_rows(rope // 2))
    with torch.no_grad():
        for layer in variant.layers:
            attention: Any = layer.self_attn
            q = attention.q_b_proj.weight.view(config.num_attention_heads, nope + rope, -1)
            q[:, nope:] = q[:, nope:][:, order].clone()
            kv = attention.kv_a_proj_with_mqa.weight
            kv[config.kv_lora_rank:] = kv[config.kv_lora_rank:][order].clone()
    return variant


def _k3_head(model: K3DSparkModel, paths: Sequence[GreedyPath], anchors: list[list[int]], reading: Reading,
             lm_head: torch.Tensor) -> Head:
    import torch

    hidden, prev, labels = [], [], []
    for path, at in zip(paths, anchors, strict=True):
        taps = path.taps(reading.taps, normed_last=reading.normed_last_tap)
        out = model.teacher_forced(taps[None], path.input_ids[None], torch.tensor(at, dtype=torch.long)[None],
                                   block_size=reading.block)
        assert out.last_hidden_state is not None and out.prev_ids is not None and out.labels is not None
        hidden.append(out.last_hidden_state[0])
        prev.append(out.prev_ids[0])
        labels.append(out.labels[0])

    def base(i: int, rows: torch.Tensor) -> torch.Tensor:
        return model.draft_logits(states[rows, i], lm_head)

    def bias(i: int, rows: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        return model.markov_bias(predecessors[rows, i]).float(), state

    def probability(logits: torch.Tensor, i: int, rows: torch.Tensor, _reading: Reading) -> torch.Tensor:
        return _probability_of(logits, tokens[rows, i])

    states, predecessors, tokens = torch.cat(hidden), torch.cat(prev), torch.cat(labels)
    return Head(len(states), base, bias, probability)


def _load_speculators(scorer: Scorer, reading: Reading) -> SpeculatorsDSpark:
    import torch

    from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark, read_tensors

    tensors = read_tensors(scorer.draft.path)
    if reading.untrained:
        tensors = untrained_like(tensors, keep=SPECULATORS_FROM_TARGET)
    return SpeculatorsDSpark(scorer.draft.config, tensors, scorer.target.embedding().float(), scorer.lm_head,
                             dtype=torch.float32)


#: Below this probability that every earlier slot was accepted, an anchor's later slots are not scored: together
#: they could add at most `k * SKIP` expected accepted drafts to it (a young draft's anchors mostly stop here
#: after one or two slots, which saves most of the vocabulary projections).
SKIP = 1e-8
#: Anchors whose vocabulary projections are computed at once (a chunk's logits: CHUNK x vocabulary floats).
CHUNK = 256


@dataclass
class Head:
    """Scores the slots of a body's forward at `anchors` anchors: `base(i, rows)` the base logits of slot `i` at
    some anchors, `bias(i, rows, state)` the Markov head's bias there (and the state it leaves, per row), and
    `probability(logits, i, rows, reading)` the probability of each row's path token (the vocabulary map)."""

    anchors: int
    base: Any
    bias: Any
    probability: Any

    def score(self, readings: Sequence[Reading]) -> list[torch.Tensor]:
        """Each reading's `[anchors, positions]` slot probabilities, `CHUNK` anchors at a time; the first slot's
        base logits computed once a chunk for every reading."""
        import torch

        out: list[list[torch.Tensor]] = [[] for _ in readings]
        for start in range(0, self.anchors, CHUNK):
            rows = torch.arange(start, min(start + CHUNK, self.anchors))
            first = self.base(0, rows)
            for n, reading in enumerate(readings):
                out[n].append(self._chained(rows, first, reading))
        return [torch.cat(parts) for parts in out]

    def _chained(self, rows: torch.Tensor, first: torch.Tensor, reading: Reading) -> torch.Tensor:
        """Slot by slot, each scored only at the anchors whose earlier slots were all accepted with probability
        `SKIP` or more (0 elsewhere)."""
        import torch

        q = torch.zeros(len(rows), reading.positions, dtype=torch.float64)
        reach = torch.ones(len(rows), dtype=torch.float64)
        alive, state = torch.arange(len(rows)), None
        for i in range(reading.positions):
            logits = first if i == 0 else self.base(i, rows[alive])
            if reading.markov:
                bias, state = self.bias(i, rows[alive], state)
                logits = logits + bias
            probability = self.probability(logits, i, rows[alive], reading).double()
            q[alive, i] = probability
            reach[alive] *= probability
            keep = reach[alive] >= SKIP
            alive = alive[keep]
            state = None if state is None else state[keep]
            if alive.numel() == 0:
                break
        return q


def _probability_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`softmax(logits)[label]` per row, from the log-softmax (one pass over the vocabulary)."""
    return logits.float().log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None])[..., 0].exp()


# ----------------------------------------------------------------------------- speculators DSpark


def target_ids(model: SpeculatorsDSpark, reading: D2tReading, vocab: int) -> torch.Tensor:
    """The target id each draft id is served as (`vocab`, a column no path token has, where it leaves the
    vocabulary): `i + d2t[i]` (offsets, the format's reading) or `d2t[i]` (absolute ids)."""
    import torch

    draft_ids = torch.arange(model.lm_head.shape[0])
    if model.d2t is None:
        return draft_ids
    mapped = model.d2t.long() + (draft_ids if reading == "offsets" else 0)
    return torch.where((mapped >= 0) & (mapped < vocab), mapped, torch.full_like(mapped, vocab))


def _speculators_head(model: SpeculatorsDSpark, paths: Sequence[GreedyPath], anchors: list[list[int]],
                      reading: Reading, lm_head: torch.Tensor) -> Head:
    import torch

    vocab = lm_head.shape[0]
    anchored = model.sample_from_anchor if reading.sample_from_anchor is None else reading.sample_from_anchor
    hidden, prev, labels = [], [], []
    for path, anchor_list in zip(paths, anchors, strict=True):
        ids = path.input_ids.long()
        kv = model.context_kv(model.context(path.taps(reading.taps, normed_last=reading.normed_last_tap)))
        at = torch.tensor(anchor_list, dtype=torch.long)
        block = torch.full((len(at), reading.block if anchored else 1 + reading.block), model.mask_token_id,
                           dtype=torch.long)
        block[:, 0] = ids[at]
        z = model.hidden_many(block, at, kv)
        hidden.append(z if anchored else z[:, 1:])
        offsets = at[:, None] + torch.arange(reading.block)
        prev.append(ids[offsets])            # slot i's Markov predecessor: the path's token i after the anchor
        labels.append(ids[offsets + 1])      # and the token it predicts
    states, predecessors, tokens = torch.cat(hidden), torch.cat(prev), torch.cat(labels)
    maps = {how: target_ids(model, how, vocab) for how in ("offsets", "absolute")}

    def base(i: int, rows: torch.Tensor) -> torch.Tensor:
        return model.base_logits(states[rows, i])

    def bias(i: int, rows: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        if not model.markov:
            return torch.zeros(()), state
        markov, _, state = model.markov_step(predecessors[rows, i], states[rows, i], state)
        return markov, state

    def probability(logits: torch.Tensor, i: int, rows: torch.Tensor, reading: Reading) -> torch.Tensor:
        in_target = torch.zeros(len(rows), vocab + 1).index_add_(1, maps[reading.d2t], logits.softmax(-1))
        return in_target.gather(1, tokens[rows, i][:, None])[:, 0]

    return Head(len(states), base, bias, probability)


@dataclass(frozen=True)
class Runner:
    """How readings of one format's drafts run: load a weight variant, run the body at the anchors (the head)."""

    load: Any      # (scorer, reading) -> model
    head: Any      # (model, paths, anchors, reading, lm_head) -> Head


#: Per format (`DraftFormat.name`: the modeling classes sit above format/, so the table lives here).
RUNNERS: dict[str, Runner] = {K3.name: Runner(_load_k3, _k3_head), SPECULATORS.name: Runner(_load_speculators,
                                                                                              _speculators_head)}
