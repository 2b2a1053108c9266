"""The DSpark objective and the acceptance arithmetic, on hand-built tensors."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from dspark_hub.errors import UsageError
from dspark_hub.train.evaluation.acceptance import AcceptanceStats, simulate
from dspark_hub.train.evaluation.drafters import ngram_proposer
from dspark_hub.train.finetuning import objective


def test_parse_loss_accepts_known_terms_and_names_the_bad_one():
    assert objective.parse_loss('{"ce":0.1,"tv":0.9}') == {"ce": 0.1, "tv": 0.9}
    for spec, words in (('{"mse":1}', "unknown term 'mse'"), ('{"ce":-1}', "non-negative"),
                        ("ce", "^loss: not valid JSON")):
        with pytest.raises(UsageError, match=words):
            objective.parse_loss(spec)


def test_anchors_are_continuation_positions_with_a_supervised_next_token():
    mask = torch.tensor([0, 0, 0, 1, 1, 1, 1, 0, 1, 1])
    assert objective.sample_anchors(mask, 10, seed=0).tolist() == [3, 4, 5, 8]
    picked = objective.sample_anchors(mask, 2, seed=5)
    assert len(picked) == 2 and set(picked.tolist()) <= {3, 4, 5, 8} and picked.tolist() == sorted(picked.tolist())
    assert torch.equal(picked, objective.sample_anchors(mask, 2, seed=5))


def test_cosine_schedule_warms_up_then_decays_to_the_floor():
    lr = [objective.cosine_lr(s, total=10, warmup=2, min_ratio=0.1) for s in range(11)]
    assert lr[:3] == [0.5, 1.0, 1.0] and lr[10] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(lr[2:]))


def _batch(final_hidden, loss_mask):
    return SimpleNamespace(final_hidden=final_hidden, loss_mask=loss_mask)


def test_losses_use_overlap_as_confidence_target_and_decay_the_slots():
    torch.manual_seed(0)
    vocab, hidden, block = 11, 5, 3
    lm_head = torch.randn(vocab, hidden)
    final = torch.randn(1, 8, hidden)
    target_logits = final @ lm_head.T
    positions = torch.tensor([[[2, 3, 4]]])
    labels = torch.tensor([[[4, 6, 2]]])
    batch = _batch(final, torch.ones(1, 8, dtype=torch.bool))
    # A draft that equals the teacher: tv and kl vanish, the overlap (confidence target) is 1.
    same = target_logits[0, 2:5][None, None]
    sums = objective.loss_sums(same, torch.zeros(1, 1, block), labels, positions, batch, lm_head,
                               terms=["ce", "kl", "tv"], gamma=4.0)
    assert sums.terms["tv"].abs() < 1e-6 and sums.terms["kl"].abs() < 1e-5
    weights = torch.exp(-torch.arange(3.0) / 4)
    assert sums.weight == pytest.approx(float(weights.sum()))
    assert sums.stats["overlap"] == pytest.approx(float(sums.stats["slots"]))
    expected_bce = float((torch.nn.functional.binary_cross_entropy_with_logits(
        torch.zeros(3), torch.ones(3), reduction="none") * weights).sum())
    assert float(sums.terms["confidence"]) == pytest.approx(expected_bce, rel=1e-5)
    # An unsupervised label voids the rest of its block (contiguous prefix).
    holes = _batch(final, torch.tensor([[1, 1, 1, 1, 0, 1, 1, 1]], dtype=torch.bool))
    voided = objective.loss_sums(same, None, labels, positions, holes, lm_head, terms=["ce"], gamma=4.0)
    assert float(voided.weight) == pytest.approx(float(weights[:1].sum()))


def test_acceptance_length_is_one_plus_the_sum_of_position_rates():
    stats = AcceptanceStats(4)
    for accepted in (0, 4, 2, 1):
        stats.record(accepted)
    assert stats.accepted_per_position == [3, 2, 1, 1] and stats.drafts == 4 and stats.accepted == 7
    assert stats.per_position == [0.75, 0.5, 0.25, 0.25]
    assert stats.acceptance_length == pytest.approx(1 + sum(stats.per_position)) == 2.75
    doc = stats.to_dict()
    assert (doc["drafts"], doc["draft_tokens"], doc["accepted"], doc["k"]) == (4, 16, 7, 4)


def test_simulation_counts_a_perfect_drafter_at_k_plus_one_and_a_wrong_one_at_one():
    tokens = torch.arange(60)
    rollout = SimpleNamespace(input_ids=tokens, prompt_length=5, dataset=None)
    perfect = simulate(rollout, lambda p: tokens[p + 1:p + 8].tolist(), 7, max_tokens=33)
    wrong = simulate(rollout, lambda p: [-1] * 7, 7, max_tokens=33)
    assert perfect.acceptance_length == 8.0 and wrong.acceptance_length == 1.0
    assert (perfect.drafts, perfect.tokens, wrong.drafts, wrong.tokens) == (4, 33, 32, 33)
    looping = SimpleNamespace(input_ids=torch.tensor([1, 2, 3] * 20), prompt_length=15, dataset=None)
    copy = simulate(looping, ngram_proposer(looping, 7), 7, max_tokens=33)
    assert copy.acceptance_length == pytest.approx(8.0)      # a loop is trivially drafted by copying
    assert math.isnan(AcceptanceStats(7).acceptance_length)


def test_the_step_that_crosses_the_budget_counts_in_full_as_vllm_counts_it():
    """vLLM drafts k tokens until the request has max_tokens and counts every accepted one, even past it."""
    tokens = torch.arange(60)
    rollout = SimpleNamespace(input_ids=tokens, prompt_length=5, dataset=None)
    stats = simulate(rollout, lambda p: tokens[p + 1:p + 5].tolist(), 4, max_tokens=7)
    # x_5 at prefill (1 token), a step of 4 + 1 (6 tokens), then one more full step for the 7th token.
    assert (stats.drafts, stats.accepted_per_position, stats.tokens) == (2, [2, 2, 2, 2], 7)
    # A rollout folder holds no tokens past its end: the last step compares with what there is.
    short = SimpleNamespace(input_ids=tokens[:13], prompt_length=5, dataset=None)
    assert simulate(short, lambda p: tokens[p + 1:p + 5].tolist(), 4).accepted_per_position == [2, 2, 1, 1]


def test_a_stop_token_ends_the_request_after_its_step_is_counted():
    tokens = torch.tensor([7] * 5 + [10, 11, 12, 99, 13, 14, 15, 16, 17, 18, 19, 20])
    rollout = SimpleNamespace(input_ids=tokens, prompt_length=5, dataset=None)
    perfect = lambda p: tokens[p + 1:p + 5].tolist()      # noqa: E731
    stopped = simulate(rollout, perfect, 4, max_tokens=10, stop_ids=[99])
    assert (stopped.drafts, stopped.accepted_per_position, stopped.tokens) == (1, [1, 1, 1, 1], 4)
    assert simulate(rollout, perfect, 4, max_tokens=10).tokens == 10
    assert simulate(SimpleNamespace(input_ids=tokens, prompt_length=8, dataset=None), perfect, 4, max_tokens=5,
                    stop_ids=[99]).drafts == 0               # the prefill token itself stops it


def _partly_predicted_rollouts(model, lm_head, k: int, shapes: list[tuple[int, int]], seed: int = 0):
    """Rollouts of random taps whose paths take, at each step, a planned number of the draft's own drafts
    (0 to k) and then a token the draft did not propose; with the planned counts, one per step."""
    from dspark_hub.train.evaluation.drafters import draft_proposer

    generator = torch.Generator().manual_seed(seed)
    config = model.config
    width = len(config.target_layer_ids) * config.target_hidden_size
    rollouts, planned = [], []
    for n, (prompt, new) in enumerate(shapes):
        ids = torch.randint(0, config.draft_vocab_size, (prompt + new,), generator=generator)
        rollout = SimpleNamespace(input_ids=ids, prompt_length=prompt, dataset=f"kind{n % 2}",
                                  aux_hidden_states=torch.randn(len(ids), width, generator=generator))
        p, plan = prompt, []
        while p + 1 < len(ids):
            drafts = draft_proposer(model, lm_head, rollout, k)(p)
            j = min(int(torch.randint(0, k + 1, (1,), generator=generator)), len(ids) - p - 1)
            ids[p + 1:p + 1 + j] = torch.tensor(drafts[:j])
            if j < k and p + 1 + j < len(ids):
                ids[p + 1 + j] = (drafts[j] + 1) % config.draft_vocab_size
            plan.append(j)
            p += j + 1
        rollouts.append(rollout)
        planned.append(plan)
    return rollouts, planned


def test_lockstep_simulation_of_a_k3_draft_counts_what_one_request_at_a_time_counts():
    """`measure_batched` drafts every unfinished request of a window in one call per round; each request's
    counts must be its own (requests finish at different rounds, windows split the rollouts)."""
    from dspark_hub.train.evaluation.acceptance import measure_batched
    from dspark_hub.train.evaluation.drafters import draft_batch_proposer, draft_proposer, measure

    model, lm_head, *_ = _draft_case(seed=3)
    model.eval()
    k = 7
    rollouts, planned = _partly_predicted_rollouts(model, lm_head, k, [(5, 20), (9, 3), (6, 33), (12, 11), (4, 26)])
    expected = AcceptanceStats(k)
    for accepted in itertools.chain.from_iterable(planned):
        expected.record(accepted)
    with torch.no_grad():
        alone = measure(rollouts, lambda r: draft_proposer(model, lm_head, r, k), k)
        together = measure_batched(rollouts, lambda chunk: draft_batch_proposer(model, lm_head, chunk, k), k,
                                   window=3)
    assert together.to_dict() == alone.to_dict()
    assert together.overall.accepted_per_position == expected.accepted_per_position
    assert together.overall.drafts == expected.drafts and min(expected.accepted_per_position) > 0
    assert together.by_dataset["kind1"].drafts == len(planned[1]) + len(planned[3])


def _draft_case(seed: int = 0):
    """A tiny draft, its hidden rows as a leaf, and a batch with padded anchors and unsupervised holes."""
    from dspark_hub.format import contract
    from dspark_hub.modeling import K3DSparkConfig, K3DSparkModel

    torch.manual_seed(seed)
    config = contract.TINY_CONFIG
    model = K3DSparkModel(K3DSparkConfig(**config))
    for parameter in model.parameters():             # post_init zeroes some heads; give every one a gradient
        torch.nn.init.normal_(parameter, std=0.2)
    vocab, width, block, seq = config["draft_vocab_size"], config["hidden_size"], 7, 24
    lm_head = torch.randn(vocab, config["target_hidden_size"]) * 0.3
    hidden = torch.randn(2, 4, block, width, requires_grad=True)
    prev_ids = torch.randint(0, vocab, (2, 4, block))
    labels = torch.randint(0, vocab, (2, 4, block))
    labels[1, 3] = -100                               # a padded anchor
    labels[0, 1, 5:] = -100                           # a block running past the sequence end
    positions = torch.randint(0, seq - 1, (2, 4, 1)) + torch.arange(block)
    positions = positions.clamp(max=seq - 1)
    loss_mask = torch.ones(2, seq, dtype=torch.bool)
    loss_mask[0, 9] = False                           # an unsupervised label voids the rest of its block
    batch = _batch(torch.randn(2, seq, config["target_hidden_size"]).to(torch.bfloat16), loss_mask)
    return model, lm_head, hidden, prev_ids, labels, positions, batch


def _loss_and_grads(model, hidden, sums):
    loss = objective.combine(sums, {"ce": 0.1, "kl": 0.3, "tv": 0.9}, 1.0, sums.weight)
    model.zero_grad()
    hidden.grad = None
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()
             if name.startswith(("markov_head", "confidence_head"))}
    return loss.detach(), hidden.grad.clone(), grads


@pytest.mark.parametrize("chunk_rows", [1, 5, 16, 409])    # 5 and 16 do not divide the supervised rows
def test_chunked_loss_and_gradients_equal_the_whole_vocabulary_loss(chunk_rows):
    model, lm_head, hidden, prev_ids, labels, positions, batch = _draft_case()
    from dspark_hub.train.finetuning.trainer import chunkable_draft_logits

    terms = ["ce", "kl", "tv"]
    confidence = model.confidence_logits(hidden, prev_ids)
    whole = objective.loss_sums(model.draft_logits(hidden, lm_head, prev_ids), confidence, labels, positions, batch,
                                lm_head, terms=terms, gamma=4.0)
    expected = _loss_and_grads(model, hidden, whole)
    draft_logits, inputs = chunkable_draft_logits(model, lm_head, hidden, prev_ids)
    chunked = objective.chunked_loss_sums(draft_logits, inputs, model.confidence_logits(hidden, prev_ids), labels,
                                          positions, batch, lm_head, terms=terms, gamma=4.0, chunk_rows=chunk_rows)
    got = _loss_and_grads(model, hidden, chunked)
    rows = int(chunked.stats["slots"])
    assert 40 < rows < 56 and rows % 5 and rows % 16       # holes and padding were skipped, chunks are ragged
    for name in [*terms, "confidence"]:
        assert torch.allclose(chunked.terms[name], whole.terms[name], rtol=1e-5, atol=1e-6), name
    for name in ("accuracy", "overlap", "slots"):
        assert torch.allclose(chunked.stats[name], whole.stats[name], rtol=1e-5, atol=1e-6), name
    assert torch.equal(chunked.weight, whole.weight)
    assert torch.allclose(got[0], expected[0], rtol=1e-6, atol=1e-7)
    assert torch.allclose(got[1], expected[1], rtol=1e-5, atol=1e-7)
    assert expected[2].keys() == got[2].keys() and len(got[2]) == 4
    for name, grad in expected[2].items():
        assert grad.abs().sum() > 0, name
        assert torch.allclose(got[2][name], grad, rtol=1e-5, atol=1e-7), name


def test_chunked_loss_never_makes_a_tensor_wider_than_a_chunk_of_vocabulary_rows():
    from torch.utils._python_dispatch import TorchDispatchMode

    model, lm_head, hidden, prev_ids, labels, positions, batch = _draft_case(1)
    vocab = lm_head.shape[0]

    class WidestVocabularyRows(TorchDispatchMode):
        rows = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(tensor, torch.Tensor) and not func.is_view and tensor.dim() and tensor.shape[-1] == vocab:
                    self.rows = max(self.rows, tensor.numel() // vocab)
            return out

    def run(chunk_rows: int) -> tuple[int, int]:
        saved = [0]

        def keep(tensor):
            if tensor.dim() and tensor.shape[-1] == vocab:
                saved[0] += tensor.numel() // vocab
            return tensor

        with WidestVocabularyRows() as watch, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            conf = model.confidence_logits(hidden, prev_ids)
            if chunk_rows:
                sums = objective.chunked_loss_sums(lambda h, p: model.draft_logits(h, lm_head, p), (hidden, prev_ids),
                                                   conf, labels, positions, batch, lm_head, terms=["ce", "kl", "tv"],
                                                   gamma=4.0, chunk_rows=chunk_rows)
            else:
                sums = objective.loss_sums(model.draft_logits(hidden, lm_head, prev_ids), conf, labels, positions,
                                           batch, lm_head, terms=["ce", "kl", "tv"], gamma=4.0)
            objective.combine(sums, {"ce": 0.1, "kl": 0.3, "tv": 0.9}, 1.0, sums.weight).backward()
        return watch.rows, saved[0]

    widest, saved = run(0)
    assert widest == labels.numel() and saved > 2 * labels.numel()      # every slot's [V] rows, kept for backward
    assert run(6) == (6, 0)         # one chunk at a time, and none kept: backward recomputes it (checkpoint)
    with pytest.raises(UsageError, match=r"^loss_chunk: 0 rows per chunk") as refused:
        objective.chunked_loss_sums(None, (hidden,), None, labels, positions, batch, lm_head, terms=["ce"],
                                    gamma=4.0, chunk_rows=0)
    assert refused.value.param == "loss_chunk"   # the CLI shows it as --loss-chunk


@pytest.mark.parametrize("mask, anchors, valid, expected", [
    ([0, 1, 1, 1, 1, 1, 1, 1, 1, 1], [[1, 3]], [[True, True]], 3 + 3),     # whole blocks of 3
    ([0, 1, 1, 1, 0, 1, 1, 1, 1, 1], [[1, 5]], [[True, True]], 2 + 3),     # a hole voids the rest of its block
    ([0, 1, 1, 1, 1, 1, 1, 1, 1, 1], [[7, 8]], [[True, True]], 2 + 1),     # the sequence ends inside the blocks
    ([0, 1, 1, 1, 1, 1, 1, 1, 1, 1], [[1, 3]], [[True, False]], 3),        # a padding anchor counts nothing
    ([0, 1, 1, 1, 1, 1, 0, 0, 0, 0], [[4, 0]], [[True, False]], 1),        # padding after the sequence: no label
])
def test_supervised_slots_count_the_slots_the_loss_keeps(mask, anchors, valid, expected):
    """`supervised_slots` (the plan's count, from the batch alone) equals `slot_weights`' mask over the labels the
    model's packed inputs give (`anchor_block_inputs`), on every kind of slot that drops out."""
    from dspark_hub.modeling.modeling_k3_dspark import anchor_block_inputs

    loss_mask = torch.tensor([mask], dtype=torch.bool)
    anchor_ids, anchor_valid = torch.tensor(anchors), torch.tensor(valid)
    input_ids = torch.arange(10)[None]
    doc_ids = torch.where(torch.tensor([[bool(m) or i < 6 for i, m in enumerate(mask)]]), 0, -1)
    packed = anchor_block_inputs(input_ids, anchor_ids, 3, 99, doc_ids=doc_ids, anchor_valid=anchor_valid)
    slot_mask, _ = objective.slot_weights(packed["labels"], packed["target_positions"], loss_mask, gamma=4.0)
    assert objective.supervised_slots(loss_mask, anchor_ids, anchor_valid, 3) == int(slot_mask.sum()) == expected
