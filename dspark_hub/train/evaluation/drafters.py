"""How a draft of each format drafts in the simulation (`acceptance`), and the prompt-lookup baseline.

`sweep_drafter_for(draft, target)` picks the drafter by the draft's format (`PROPOSERS`, keyed by
`DraftFormat.name`: the modeling classes sit above `format/`, so the table lives here) and returns
(rollouts, ks) -> `propose_many` per k: each rollout's draft context is encoded once and drafted from at every
k (`eval --k`, `acceptance.measure_lanes`); `drafter_for(draft, target)` is its one k: rollouts ->
`propose_many`. `choose_drafters(inputs)` is eval's choice: the draft's, the reference's and the baseline.
A draft's proposals are `Drafts`: the tokens, and the confidence head's estimate per slot when the draft has
one. A k3_dspark draft drafts the
requests of a round together (`draft_batch_proposer`), a speculators DSpark one request at a time
(its pruned vocabulary makes a request cheap), the baseline copies earlier tokens (`ngram_proposer`).
`measure_draft` and `measure_ngram` are the two counts `finetune` logs on held-out data.

`drafter_for(..., rows=True)` is the probabilistic kind (vLLM's `draft_sample_method="probabilistic"`): for
each request it gives the draft's raw logits `[k, V]` over the target vocabulary along the rollout's path, the
Markov head chained on the path's tokens, which `sampled_eval` verifies.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dspark_hub.errors import UsageError
from dspark_hub.format.registry import K3, SPECULATORS
from dspark_hub.progress import Progress
from dspark_hub.train.evaluation.acceptance import (
    Drafter,
    Measurement,
    ProposeMany,
    SweepDrafter,
    measure_batched,
)

if TYPE_CHECKING:
    import torch

    from dspark_hub.modeling import K3DSparkModel
    from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark
    from dspark_hub.train.evaluation.inputs import DraftUnderTest, EvalInputs
    from dspark_hub.train.target.generate import Rollout
    from dspark_hub.train.target.target import Target

class Drafts(list[int]):
    """A request's drafted tokens (a list), with the confidence head's estimate for each slot (the probability
    that slot's draft is accepted once the ones before it were), or None for a draft without the head."""

    confidence: list[float] | None = None

    @classmethod
    def of(cls, tokens: Iterable[int], confidence: Iterable[float] | None) -> Drafts:
        drafts = cls(tokens)
        drafts.confidence = None if confidence is None else [float(c) for c in confidence]
        return drafts


def one_at_a_time(make_proposer: Callable[[Rollout], Callable[[int], Any]]) -> Callable[[list[Rollout]], ProposeMany]:
    """A batch proposer maker from a per-rollout one: each request is drafted on its own."""
    def make(rollouts: list[Rollout]) -> ProposeMany:
        proposers = [make_proposer(r) for r in rollouts]
        return lambda requests: [proposers[i](p) for i, p in requests]

    return make


def measure(rollouts: Iterable[Rollout], make_proposer: Callable[[Rollout], Callable[[int], list[int]]], k: int,
            progress: Progress | None = None, *, max_tokens: int | None = None,
            stop_ids: Iterable[int] = ()) -> Measurement:
    """Simulate every rollout with the proposer `make_proposer(rollout)` builds (`simulate`)."""
    return measure_batched(rollouts, one_at_a_time(make_proposer), k, progress, max_tokens=max_tokens,
                           stop_ids=stop_ids)


def draft_proposer(model: K3DSparkModel, lm_head_weight: torch.Tensor, rollout: Rollout,
                   block_size: int) -> Callable[[int], list[int]]:
    """`propose(p)` for a k3_dspark draft: context = taps of positions < p, anchor = x_p."""
    propose_many = draft_batch_proposer(model, lm_head_weight, [rollout], block_size)
    return lambda p: propose_many([(0, p)])[0]


def draft_batch_proposer(model: K3DSparkModel, lm_head_weight: torch.Tensor, rollouts: list[Rollout],
                         block_size: int) -> ProposeMany:
    """`propose_many` for a k3_dspark draft over `rollouts` at one k (`draft_batch_proposers`)."""
    return draft_batch_proposers(model, lm_head_weight, rollouts, [block_size])[block_size]


def draft_batch_proposers(model: K3DSparkModel, lm_head_weight: torch.Tensor, rollouts: list[Rollout],
                          ks: Sequence[int]) -> dict[int, ProposeMany]:
    """`propose_many` per k for a k3_dspark draft over `rollouts`: the context latents once, then per request one
    block forward of k rows, and one vocabulary projection and one Markov chain for all requests of a call.

    The projection and the chain read the whole vocabulary's weights for a few rows each, so they are
    bound by memory: on 40 SmolLM2 requests at once they cost 5 ms a request against 56 ms one at a
    time (2 cores, float32).
    """
    import torch  # heavy: only a measurement of a draft pays for it

    dtype, device = model.context_proj.weight.dtype, model.context_proj.weight.device
    with torch.no_grad():
        latents = [model.encode_context(r.aux_hidden_states[None].to(device=device, dtype=dtype)) for r in rollouts]
    ids = [r.input_ids.to(device) for r in rollouts]

    def at(block_size: int) -> ProposeMany:
        def propose_many(requests: list[tuple[int, int]]) -> list[list[int]]:
            anchors = torch.stack([ids[i][p] for i, p in requests])
            blocks = model.draft_block(anchors, block_size)
            rows = []
            for n, (i, p) in enumerate(requests):        # contexts differ in length: one forward each
                context = tuple(latent[:, :p] for latent in latents[i])
                rows.append(model(input_ids=blocks[n:n + 1], context_latents=context).last_hidden_state)
            proposal = model.decode_block(torch.cat(rows), anchors, lm_head_weight)
            assert proposal.tokens is not None   # decode_block always sets the tokens
            scores = proposal.confidence.tolist() if proposal.confidence is not None else None
            return [Drafts.of(tokens, None if scores is None else scores[n])
                    for n, tokens in enumerate(proposal.tokens.tolist())]

        return propose_many

    return {k: at(k) for k in ks}


def speculators_proposer(draft: SpeculatorsDSpark, rollout: Rollout, k: int) -> Callable[[int], list[int]]:
    """`propose(p)` for a speculators DSpark (`modeling.speculators_dspark.SpeculatorsDSpark`)."""
    return speculators_proposers(draft, rollout, [k])[k]


def speculators_proposers(draft: SpeculatorsDSpark, rollout: Rollout,
                          ks: Sequence[int]) -> dict[int, Callable[[int], list[int]]]:
    """`propose(p)` per k for a speculators DSpark: the rollout's context keys and values once, for every k."""
    import torch  # heavy: only a measurement of a draft pays for it

    with torch.no_grad():
        kv = draft.context_kv(draft.context(rollout.aux_hidden_states))
    ids = rollout.input_ids.tolist()

    def at(k: int) -> Callable[[int], list[int]]:
        return lambda p: Drafts.of(*draft.propose_scored(kv, ids[p], p, k))

    return {k: at(k) for k in ks}


def ngram_proposer(rollout: Rollout, block_size: int, max_ngram: int = 3,
                   min_ngram: int = 1) -> Callable[[int], list[int]]:
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


def measure_draft(model: K3DSparkModel, lm_head_weight: torch.Tensor, rollouts: Iterable[Rollout], block_size: int,
                  progress: Progress | None = None, **bounds: Any) -> Measurement:
    """Acceptance of a k3_dspark draft (in eval mode, no gradients) on rollouts; `bounds` as `measure`'s."""
    import torch  # heavy: only a measurement of a draft pays for it

    was_training = model.training
    model.train(False)
    try:
        with torch.no_grad():
            return measure_batched(rollouts, lambda chunk: draft_batch_proposer(model, lm_head_weight, chunk,
                                                                                 block_size), block_size,
                                   progress, **bounds)
    finally:
        model.train(was_training)


def baseline_drafter(block_size: int) -> Drafter:
    """The prompt-lookup baseline (`acceptance.BASELINE`) as a drafter: each request on its own."""
    return one_at_a_time(lambda r: ngram_proposer(r, block_size))


def measure_ngram(rollouts: Iterable[Rollout], block_size: int, **bounds: Any) -> Measurement:
    """The prompt-lookup baseline's acceptance on rollouts; `bounds` as `acceptance.measure`'s."""
    return measure_batched(rollouts, baseline_drafter(block_size), block_size, **bounds)


# ----------------------------------------------------------------------------- a drafter per format


@dataclass(frozen=True)
class EvalDrafters:
    """What one eval counts: the draft at every k it is measured at, and the other drafters at the draft's k by
    name (the prompt-lookup `baseline`, and the `reference` draft when there is one)."""

    draft: SweepDrafter
    others: dict[str, Drafter]


def choose_drafters(inputs: EvalInputs, *, markov: bool = True, lm_head: torch.Tensor | None = None
                    ) -> EvalDrafters:
    """The drafters of an eval, each by its draft's format: greedy drafts (the draft's at every k of a sweep), or
    under a sampled eval's probabilistic drafting the drafts' logits along each path. `lm_head`: the target's,
    float32 (read from the target when not given).

    Raises:
        UsageError: `markov` False for a format whose Markov head is not optional.
    """
    draft, target, sampling = inputs.draft, inputs.target, inputs.sampling
    rows = sampling.draft_sample_method == "probabilistic"
    lm_head = _lm_head(draft, target, markov, lm_head)      # read once, for the draft and the reference
    others: dict[str, Drafter] = {"baseline": baseline_drafter(draft.k)}
    if inputs.reference is not None:
        others["reference"] = drafter_for(inputs.reference, target, lm_head=lm_head, rows=rows)
    return EvalDrafters(sweep_drafter_for(draft, target, markov=markov, lm_head=lm_head, rows=rows), others)


def drafter_for(draft: DraftUnderTest, target: Target, *, markov: bool = True, lm_head: torch.Tensor | None = None,
                rows: bool = False) -> Drafter:
    """rollouts -> propose_many for the draft's format, at the draft's k (`sweep_drafter_for` at one k).

    Raises:
        UsageError: `markov` False for a format whose Markov head is not optional.
    """
    sweep = sweep_drafter_for(draft, target, markov=markov, lm_head=lm_head, rows=rows)
    return lambda rollouts: sweep(rollouts, [draft.k])[draft.k]


def sweep_drafter_for(draft: DraftUnderTest, target: Target, *, markov: bool = True,
                      lm_head: torch.Tensor | None = None, rows: bool = False) -> SweepDrafter:
    """(rollouts, ks) -> {k: propose_many} for the draft's format, each rollout's context encoded once: greedy
    drafts, or with `rows` the draft's logits along each path (probabilistic drafting). `lm_head`: the target's,
    float32 (read from the target when not given).

    Raises:
        UsageError: `markov` False for a format whose Markov head is not optional.
    """
    table = ROW_PROPOSERS if rows else PROPOSERS
    return table[draft.format.name](draft, target, _lm_head(draft, target, markov, lm_head), markov)


def _lm_head(draft: DraftUnderTest, target: Target, markov: bool, lm_head: torch.Tensor | None) -> torch.Tensor:
    """The target's lm_head in float32, once `markov` is checked against the draft's format."""
    if not markov and not draft.format.markov_optional:
        raise UsageError(f"a {draft.format.title} draft always drafts with its Markov head; `markov` False is for "
                         "drafts whose head is optional")
    return target.lm_head().float() if lm_head is None else lm_head


def _load_draft(path: str | os.PathLike[str]) -> K3DSparkModel:
    # torch and modeling (transformers): only a measurement of a k3_dspark draft pays for them
    import torch

    from dspark_hub.modeling import load_checkpoint

    model: K3DSparkModel = load_checkpoint(path, dtype=torch.float32).model
    model.train(False)
    return model


def _load_speculators(draft: DraftUnderTest, target: Target, lm_head: torch.Tensor, markov: bool
                      ) -> SpeculatorsDSpark:
    import torch  # heavy: only a measurement pays for it

    # modeling imports torch and transformers: only a measurement of a speculators draft pays for them
    from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark

    return SpeculatorsDSpark.from_folder(draft.path, target.embedding(), lm_head, dtype=torch.float32, markov=markov)


def _speculators_drafter(draft: DraftUnderTest, target: Target, lm_head: torch.Tensor, markov: bool) -> SweepDrafter:
    model = _load_speculators(draft, target, lm_head, markov)
    return _each_request_alone(lambda rollout, ks: speculators_proposers(model, rollout, ks))


def _each_request_alone(proposers_of: Callable[[Rollout, Sequence[int]], dict[int, Callable[[int], Any]]]
                        ) -> SweepDrafter:
    """A sweep drafter that drafts each request on its own (a speculators DSpark's pruned vocabulary makes a request
    cheap: 10 ms on SmolLM2), from each rollout's proposers at every k (its context encoded once)."""
    def make(rollouts: list[Rollout], ks: Sequence[int]) -> dict[int, ProposeMany]:
        proposers = [proposers_of(r, ks) for r in rollouts]

        def at(k: int) -> ProposeMany:
            return lambda requests: [proposers[i][k](p) for i, p in requests]

        return {k: at(k) for k in ks}

    return make


def _k3_drafter(draft: DraftUnderTest, target: Target, lm_head: torch.Tensor, markov: bool) -> SweepDrafter:
    k3 = _load_draft(draft.path)
    return lambda rollouts, ks: draft_batch_proposers(k3, lm_head, rollouts, ks)


def _speculators_row_drafter(draft: DraftUnderTest, target: Target, lm_head: torch.Tensor, markov: bool
                             ) -> SweepDrafter:
    model = _load_speculators(draft, target, lm_head, markov)
    return _each_request_alone(lambda rollout, ks: speculators_row_proposers(model, rollout, ks))


def speculators_row_proposers(draft: SpeculatorsDSpark, rollout: Rollout,
                              ks: Sequence[int]) -> dict[int, Callable[[int], torch.Tensor]]:
    """`propose(p)` per k of the probabilistic kind for a speculators DSpark: its logits along the rollout's path,
    from the rollout's context keys and values computed once for every k."""
    import torch  # heavy: only a measurement of a draft pays for it

    with torch.no_grad():
        kv = draft.context_kv(draft.context(rollout.aux_hidden_states))
    ids = rollout.input_ids.tolist()

    def at(k: int) -> Callable[[int], torch.Tensor]:
        return lambda p: draft.path_logits(kv, path_chain(ids, p, k), p, k)

    return {k: at(k) for k in ks}


def path_chain(ids: list[int], p: int, k: int) -> list[int]:
    """`[x_p, ..., x_{p+k-1}]`, the last token repeated past the path's end (rows there are never verified)."""
    chain = ids[p:p + k]
    return chain + [chain[-1]] * (k - len(chain))


def _k3_row_drafter(draft: DraftUnderTest, target: Target, lm_head: torch.Tensor, markov: bool) -> SweepDrafter:
    k3 = _load_draft(draft.path)
    return lambda rollouts, ks: draft_row_proposers(k3, lm_head, rollouts, ks)


def draft_row_proposers(model: K3DSparkModel, lm_head_weight: torch.Tensor, rollouts: list[Rollout],
                        ks: Sequence[int]) -> dict[int, ProposeMany]:
    """`propose_many` per k of the probabilistic kind for a k3_dspark draft: each request's block logits `[k, V]`
    along the path (the Markov bias of each slot from the path token before it), from the context latents
    encoded once for every k."""
    import torch  # heavy: only a measurement of a draft pays for it

    device = model.context_proj.weight.device
    with torch.no_grad():
        latents = [model.encode_context(r.aux_hidden_states[None].to(device=device,
                                                                     dtype=model.context_proj.weight.dtype))
                   for r in rollouts]
    ids = [r.input_ids.tolist() for r in rollouts]

    def at(block_size: int) -> ProposeMany:
        def propose_many(requests: list[tuple[int, int]]) -> list[torch.Tensor]:
            anchors = torch.tensor([ids[i][p] for i, p in requests], device=device)
            blocks = model.draft_block(anchors, block_size)
            hidden = torch.cat([model(input_ids=blocks[n:n + 1], context_latents=tuple(x[:, :p] for x in latents[i])
                                      ).last_hidden_state for n, (i, p) in enumerate(requests)])
            chains = torch.tensor([path_chain(ids[i], p, block_size) for i, p in requests], device=device)
            return list(model.draft_logits(hidden, lm_head_weight, chains).cpu())

        return propose_many

    return {k: at(k) for k in ks}


#: How a draft of each format drafts (the modeling classes sit above format/, so the tables live here): greedy
#: drafts for every k of a sweep, and the draft's logits along a path (probabilistic drafting).
PROPOSERS: dict[str, Callable[[DraftUnderTest, Target, torch.Tensor, bool], SweepDrafter]] = {
    K3.name: _k3_drafter, SPECULATORS.name: _speculators_drafter}
ROW_PROPOSERS: dict[str, Callable[[DraftUnderTest, Target, torch.Tensor, bool], SweepDrafter]] = {
    K3.name: _k3_row_drafter, SPECULATORS.name: _speculators_row_drafter}
