"""What one training step will cost, estimated before step 1 from the config and step 1's batch.

`finetune` packs every anchor block of a sequence into one pass: with A anchors and blocks of K
rows, a sequence of T positions runs `R = A x K` block rows, and every block row's attention scores
span all `T + R` keys (context rows, then every block row; a mask keeps the context rows before the
anchor and the block's own K rows). So attention grows with `(A x K)^2`: at the `tiny` profile, 512
anchors of 7 rows over a 600-token sequence spend almost all of a step there, and the
probabilities it keeps for backward (`layers x heads x R x (T + R)` floats a sequence) are most of
the memory. The vocabulary-sized work is `A x K x vocabulary` per sequence: the draft's logits and
the target's targets for every supervised slot.

`step_plan` returns a `TrainPlan`: the step's shape (sequences, positions, anchors, block rows,
keys per block row, vocabulary rows), the compute split by part (multiply-adds x 2, forward plus
backward), and an estimate of the memory the step needs, by part:

- `states`: fp32 master weights of every tensor, plus fp32 gradients and two AdamW moments of
  the trained ones (16 B a trained parameter, 4 B a frozen one; divided by the ranks under FSDP2);
- `target_lm_head`: the target's `lm_head` in fp32 (vocabulary x target hidden x 4 B);
- `loss`: about six `[rows, vocabulary]` fp32 tensors alive at once (logits, log-softmax, softmax,
  target targets, their difference), `loss_chunk` rows (or every slot row when unchunked);
- `attention`: the probabilities each layer keeps for backward, plus two more layers' worth of
  scores and gradients in flight, plus the boolean mask and its float form;
- `activations`: what autograd saves per block row and per context row (norm inputs, projections,
  queries, keys, values, MLP intermediates), counted from the module structure at 4 B an element
  (under bf16 autocast the bf16 copies sit next to fp32 norm inputs, about the same bytes).

The counts were checked against what autograd actually saves (`torch.autograd.graph.saved_tensors_hooks`,
as `bench/bench_k3_memory.py` measures) at the tiny profile, and the total against the peak RSS
of tiny runs; they are estimates, the process's own runtime (Python, torch, about 0.4 GB on CPU)
comes on top, and GPU attention kernels keep less than the CPU math kernel counted here.

A speculators DSpark packs the step's sequences into one row (`packed_step_plan`): its A anchors
make `A x K` block rows that each attend only to their own sequence's rows before the anchor and
to their block, so its attention grows with the sequences, not the packed row; its context rows
(the fc projection of every tap, each layer's keys and values) grow with the row.

Both plans also say what the run is worth: step 1's anchors and supervised block slots (slots
whose label counts in the loss, `objective.supervised_slots` and
`SpeculatorsDSparkTrainer.slot_mask`), and those times the run's steps (an estimate: later
batches draw other sequences and anchors; the result counts what was trained).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dspark_hub.documents import Document

#: fp32 `[rows, vocabulary]` tensors alive at once in the loss (logits, log-softmax, softmax, targets, ...).
LOSS_TENSORS = 6


@dataclass(frozen=True)
class TrainPlan(Document):
    """One step's shape, compute split and memory estimate (per rank; see the module docstring)."""

    KEYS = ("sequences", "positions", "tokens", "supervised_tokens", "anchors", "block_size", "block_rows",
            "keys_per_row", "vocabulary", "vocabulary_rows", "flops", "total_flops", "dominant", "memory_bytes=memory",
            "memory_total_bytes=memory_bytes", "world_size", "layout", "step_anchors", "supervised_slots", "steps",
            "run_anchors", "run_supervised_slots")

    sequences: int            # on this rank
    positions: int            # T, the padded sequence length
    tokens: int               # positions of the batch that are real tokens
    supervised_tokens: int    # of which loss-masked continuation tokens
    anchors: int              # A, anchors per sequence (padded to the longest)
    block_size: int           # K
    block_rows: int           # sequences x A x K
    keys_per_row: int         # T + A x K: the attention span of every block row
    vocabulary: int
    vocabulary_rows: int      # (anchor, slot) rows whose vocabulary-wide logits and targets are computed
    flops: Mapping[str, float]        # per step, forward + backward, by part
    memory: Mapping[str, int]         # bytes, by part (estimate)
    world_size: int = 1
    step_anchors: int = 0             # anchors of the step's batch (this rank's)
    supervised_slots: int = 0         # of their block slots, those with a supervised label
    steps: int = 0                    # the run's steps
    layout: str = "padded"            # "padded": B sequences padded to T; "packed": one row of B sequences

    @property
    def dominant(self) -> str:
        """The part that costs the most compute."""
        return max(self.flops, key=lambda part: self.flops[part])

    @property
    def total_flops(self) -> float:
        return float(sum(self.flops.values()))

    @property
    def memory_bytes(self) -> int:
        return int(sum(self.memory.values()))

    @property
    def run_anchors(self) -> int:
        """Step 1's anchors times the run's steps and ranks (an estimate of what the run trains)."""
        return self.step_anchors * self.steps * self.world_size

    @property
    def run_supervised_slots(self) -> int:
        """Step 1's supervised block slots times the run's steps and ranks (an estimate)."""
        return self.supervised_slots * self.steps * self.world_size


def _get(config: Mapping[str, Any] | Any, key: str, default: Any = None) -> Any:
    value = config.get(key, default) if isinstance(config, Mapping) else getattr(config, key, default)
    return default if value is None else value


def step_plan(config: Mapping[str, Any] | Any, *, sequences: int, positions: int, tokens: int, supervised_tokens: int,
              anchors: int, valid_anchors: int, block_size: int, vocabulary: int, target_hidden_size: int,
              trained_parameters: int, frozen_parameters: int, loss_chunk: int, bf16: bool = False,
              world_size: int = 1, sharded_states: bool = False, supervised_slots: int = 0,
              steps: int = 0) -> TrainPlan:
    """The `TrainPlan` of one rank's step.

    Args:
        config: the draft's config (`config.json` keys or a `K3DSparkConfig`).
        sequences, positions, tokens, supervised_tokens: the rank's batch: B, the padded length T, the
            real tokens and the supervised ones.
        anchors: A, anchors per sequence after padding; `valid_anchors`: real anchors over the batch.
        block_size: K.
        vocabulary, target_hidden_size: the target `lm_head`'s shape.
        trained_parameters, frozen_parameters: the draft's parameter counts.
        loss_chunk: rows per loss chunk (0 = the whole `[B, A, K, V]` at once).
        bf16: the forward runs under bf16 autocast.
        world_size, sharded_states: ranks, and whether the states are sharded over them (FSDP2).
        supervised_slots: block slots of the batch whose label is supervised; `steps`: the run's steps.
    """
    h = int(_get(config, "hidden_size"))
    inter = int(_get(config, "intermediate_size"))
    layers = int(_get(config, "num_hidden_layers"))
    heads = int(_get(config, "num_attention_heads"))
    q_rank = int(_get(config, "q_lora_rank"))
    kv_rank = int(_get(config, "kv_lora_rank"))
    nope, rope, v = (int(_get(config, k)) for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    taps = int(_get(config, "num_target_layers"))
    target_hidden = int(_get(config, "target_hidden_size", target_hidden_size))
    markov = int(_get(config, "markov_rank", 0))
    qk = nope + rope
    b, t, k = sequences, positions, block_size
    rows = anchors * k                                # block rows per sequence
    keys = t + rows
    block_rows = b * rows
    slot_rows = valid_anchors * k                     # rows with a label (an upper bound: the block's tail
    vocab_rows = slot_rows if loss_chunk else block_rows   # may run past the sequence)

    # Multiply-adds x 2, forward; backward ~2x forward where gradients flow.
    attention = 2.0 * b * layers * heads * rows * keys * (qk + v)
    per_block_row = h * q_rank + q_rank * heads * qk + h * (kv_rank + rope) + heads * v * h + 3 * h * inter
    per_key_row = kv_rank * heads * (nope + v)
    per_context_row = h * (kv_rank + rope)
    decoder = 2.0 * b * (layers * (rows * per_block_row + keys * per_key_row + t * per_context_row)
                         + t * taps * target_hidden * h)
    draft_vocab = 2.0 * vocab_rows * vocabulary * (h + markov)
    target_vocab = 2.0 * vocab_rows * vocabulary * target_hidden
    recompute = 1 if loss_chunk else 0                # a chunk's forward runs again in backward
    flops = {"attention": 3 * attention, "decoder": 3 * decoder,
             "vocabulary": (3 + recompute) * draft_vocab + (1 + recompute) * target_vocab}

    states = trained_parameters * 16 + frozen_parameters * 4
    if sharded_states and world_size > 1:
        states //= world_size
    probs = b * heads * rows * keys * (2 if bf16 else 4)
    mask = b * rows * keys * (1 + 4)
    block_row_elements = (layers * (6 * h + 3 * q_rank + 2 * rope + 2 * kv_rank + heads * qk + heads * v + 4 * inter
                                    + 5 + kv_rank + heads * qk + heads * v)
                          + 3 * h + markov + 1)
    context_row_elements = taps * target_hidden + 3 * h + 1 + rope + layers * (3 * kv_rank + rope + 1 + heads * qk
                                                                               + heads * v)
    loss_rows = min(loss_chunk, max(vocab_rows, 1)) if loss_chunk else vocab_rows
    memory = {
        "states": states,
        "teacher_lm_head": vocabulary * target_hidden_size * 4,
        "loss": LOSS_TENSORS * loss_rows * vocabulary * 4,
        "attention": (layers + 2) * probs + mask,
        "activations": 4 * (block_rows * block_row_elements + b * t * context_row_elements),
    }
    return TrainPlan(sequences=b, positions=t, tokens=tokens, supervised_tokens=supervised_tokens, anchors=anchors,
                     block_size=k, block_rows=block_rows, keys_per_row=keys, vocabulary=vocabulary,
                     vocabulary_rows=vocab_rows, flops=flops, memory=memory, world_size=world_size,
                     step_anchors=valid_anchors, supervised_slots=supervised_slots, steps=steps)


def packed_step_plan(geometry: Any, *, sequences: int, positions: int, supervised_tokens: int, anchors: int,
                     block_size: int, attention_keys: int, widest_keys: int, target_rows: int,
                     trained_parameters: int, frozen_parameters: int, bf16: bool = False, supervised_slots: int = 0,
                     steps: int = 0) -> TrainPlan:
    """The `TrainPlan` of a speculators DSpark step: one packed row (see the module docstring).

    Args:
        geometry: the draft's `format.speculators.Geometry`.
        sequences, positions, supervised_tokens: the packed row: its sequences, length N and supervised tokens.
        anchors: A, the row's anchors; `block_size`: K.
        attention_keys: keys summed over the block rows (each: its sequence's rows before the anchor, plus K);
            `widest_keys`: the most any block row attends over.
        target_rows: distinct rows whose target distribution the loss reads.
        trained_parameters, frozen_parameters: the draft's parameter counts (the target's embedding and
            lm_head are counted from the geometry).
        bf16: the forward runs under bf16 autocast.
        supervised_slots, steps: as in `step_plan`.
    """
    g = geometry
    h, heads, kv, d, inter, layers = g.hidden_size, g.heads, g.kv_heads, g.head_dim, g.intermediate_size, g.layers
    width = g.taps * g.tap_width
    rank = max(0, g.markov_rank)
    n, rows = positions, anchors * block_size
    # Multiply-adds x 2, forward; backward ~2x forward where gradients flow: fc's only to its weight (the taps
    # are data), the target's rows none.
    fc = 2.0 * n * width * h
    context = 2.0 * n * layers * h * 2 * kv * d
    block = 2.0 * rows * layers * (h * heads * d + h * 2 * kv * d + heads * d * h + 3 * h * inter)
    attention = 2.0 * layers * heads * d * 2 * attention_keys
    draft_vocab = 2.0 * rows * g.draft_vocab_size * (h + rank)
    target_vocab = 2.0 * target_rows * g.draft_vocab_size * g.tap_width
    flops = {"attention": 3 * attention, "decoder": 2 * fc + 3 * (context + block),
             "vocabulary": 3 * draft_vocab + target_vocab}
    float_bytes = 2 if bf16 else 4
    memory = {
        "states": trained_parameters * 16 + frozen_parameters * 4,
        "teacher_lm_head": g.draft_vocab_size * g.tap_width * 4,     # its rows of the draft vocabulary
        "target_embedding": g.vocab_size * g.tap_width * 4,          # the blocks' token rows come from it
        "loss": LOSS_TENSORS * (rows + target_rows) * g.draft_vocab_size * 4,
        "attention": (layers + 2) * heads * attention_keys * float_bytes,
        # context rows: the taps as stored (bf16) and cast, fc's output, each layer's keys and values
        # (repeated to the query heads); block rows: what a decoder layer saves per row
        "activations": n * (width * (2 + 4) + 4 * (3 * h + layers * 2 * (kv + heads) * d))
                       + 4 * rows * (layers * (6 * h + 4 * heads * d + 2 * kv * d + 4 * inter) + 3 * h + rank),
    }
    return TrainPlan(sequences=sequences, positions=n, tokens=n, supervised_tokens=supervised_tokens, anchors=anchors,
                     block_size=block_size, block_rows=rows, keys_per_row=widest_keys,
                     vocabulary=g.draft_vocab_size, vocabulary_rows=rows, flops=flops, memory=memory,
                     step_anchors=anchors, supervised_slots=supervised_slots, steps=steps, layout="packed")
