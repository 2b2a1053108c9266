"""K3-scale memory of the trainer side: computed from the contract, plus activations measured at K3 width.

Usage: python bench/bench_k3_memory.py [--ranks 8] [--context 512] [--json out.json]

1. Computed (no model built): the official k3_dspark roster (`contract.REFERENCE_CONFIG`) split into
   trained tensors and the frozen `embed_tokens`; per rank under FSDP2 at `--ranks` ranks with fp32
   master weights and AdamW (trained: 4 B weight + 4 B gradient + 8 B Adam moments; frozen: 4 B), the
   transient all-gathers of our FSDP2 units (each decoder layer, and the root: everything else), the
   teacher lm_head every rank holds for the targets (fp32), and one chunk of the chunked loss
   (`objective.DEFAULT_LOSS_CHUNK` rows x the vocabulary, fp32).
2. Measured: the bytes autograd saves for backward (parameters excluded) in one teacher-forced
   forward of ONE K3-width decoder layer (hidden 7168, 64 heads, MLA ranks 1536/512, MLP 14336; the
   5-tap context projection) under bf16 autocast, for anchors A in {8, 16} and context rows T in
   {T0, 2 T0}; the slopes give bytes per anchor block (7 rows) and per context row, per layer. The
   vocabulary is cut to 8192 for this part only (it does not enter the decoder's activations; the
   loss is item 1's chunk). Measured with 1 and 2 layers, so the per-layer part and the shared part
   (context projection, embeddings, heads) come apart; totals are for the draft's 5 layers. CPU,
   float32 master weights; PyTorch's CPU attention keeps its probabilities, GPU kernels keep less.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GIB = 2**30


def computed(ranks: int) -> dict:
    from dspark_hub.format import contract
    from dspark_hub.train.finetuning.objective import DEFAULT_LOSS_CHUNK

    config = contract.REFERENCE_CONFIG
    roster = contract.roster(config)
    sizes = {name: math.prod(spec.shape) for name, spec in roster.items()}
    frozen = sizes["embed_tokens.weight"]
    trained = sum(sizes.values()) - frozen
    layer = sum(v for n, v in sizes.items() if n.startswith("layers.0."))
    root_unit = sum(sizes.values()) - config["num_hidden_layers"] * layer
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    states = trained * 16 + frozen * 4
    return {
        "parameters": sum(sizes.values()), "trained": trained, "frozen_embed_tokens": frozen,
        "per_layer": layer, "root_unit": root_unit, "ranks": ranks,
        "states_total_bytes": states, "states_per_rank_bytes": states / ranks,
        "layer_gather_bytes": layer * 4, "root_gather_bytes": root_unit * 4,
        "teacher_lm_head_fp32_bytes": vocab * hidden * 4,
        "loss_chunk_rows": DEFAULT_LOSS_CHUNK, "loss_chunk_tensor_bytes": DEFAULT_LOSS_CHUNK * vocab * 4,
    }


def saved_bytes(model, context_rows: int, anchors: int, block: int = 7) -> int:
    """Bytes autograd keeps for backward in one teacher-forced forward (parameters excluded)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    taps, hidden = model.config.num_target_layers, model.config.hidden_size
    length = context_rows + anchors * block + block
    generator = torch.Generator().manual_seed(0)
    context = torch.randn(1, length, taps * hidden, generator=generator).to(torch.bfloat16)
    ids = torch.randint(10, 8000, (1, length), generator=generator)
    anchor_ids = torch.arange(context_rows, context_rows + anchors * block, block)[None]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.teacher_forced(context, ids, anchor_ids, block_size=block)
    del out
    return sum(seen.values())


def measured(context: int) -> dict:
    """Saved bytes for 1 and 2 decoder layers: slopes per anchor block and per context row, split
    into the part every layer adds and the shared part (context projection, embeddings, heads)."""
    import torch

    from dspark_hub.format import contract
    from dspark_hub.modeling.configuration_k3_dspark import K3DSparkConfig
    from dspark_hub.modeling.modeling_k3_dspark import K3DSparkModel

    torch.set_num_threads(1)
    samples: dict[str, int] = {}
    slopes: dict[int, tuple[float, float]] = {}
    for layers in (1, 2):
        values = {**contract.REFERENCE_CONFIG, "num_hidden_layers": layers, "vocab_size": 8192,
                  "draft_vocab_size": 8192, "mask_token_id": 8189, "pad_token_id": 8191, "bos_token_id": 1,
                  "eos_token_id": 2, "torch_dtype": "float32"}
        torch.manual_seed(0)
        model = K3DSparkModel(K3DSparkConfig(**values)).float().train()
        got = {}
        for rows, anchors in ((context, 8), (context, 16), (2 * context, 8)):
            started = time.perf_counter()
            got[(rows, anchors)] = saved_bytes(model, rows, anchors)
            samples[f"L{layers}_T{rows}_A{anchors}"] = got[(rows, anchors)]
            print(f"  {layers} layer(s), T={rows} A={anchors}: {got[(rows, anchors)] / 2**20:,.1f} MiB saved "
                  f"({time.perf_counter() - started:.1f} s)", flush=True)
        per_anchor = (got[(context, 16)] - got[(context, 8)]) / 8
        per_row = (got[(2 * context, 8)] - got[(context, 8)]) / context
        slopes[layers] = (per_anchor, per_row)
        del model
    per_layer = tuple(b - a for a, b in zip(slopes[1], slopes[2], strict=True))
    shared = tuple(a - p for a, p in zip(slopes[1], per_layer, strict=True))
    return {"samples": samples, "per_anchor_block_per_layer_bytes": per_layer[0],
            "per_anchor_block_shared_bytes": shared[0],
            "per_context_row_per_layer_bytes": per_layer[1], "per_context_row_shared_bytes": shared[1],
            "dtype": "bf16 autocast over fp32 weights", "context_rows": context}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    c = computed(args.ranks)
    print(f"computed from the contract (k3_dspark, {c['parameters']:,} parameters):")
    print(f"  trained {c['trained']:,} x 16 B + frozen embed_tokens {c['frozen_embed_tokens']:,} x 4 B = "
          f"{c['states_total_bytes'] / GIB:.1f} GiB -> {c['states_per_rank_bytes'] / GIB:.2f} GiB per rank at "
          f"{c['ranks']} ranks (FSDP2)")
    print(f"  all-gather (transient): a decoder layer {c['layer_gather_bytes'] / GIB:.2f} GiB, the root unit "
          f"{c['root_gather_bytes'] / GIB:.2f} GiB; teacher lm_head fp32 "
          f"{c['teacher_lm_head_fp32_bytes'] / GIB:.2f} GiB "
          f"per rank; loss chunk {c['loss_chunk_rows']} rows: {c['loss_chunk_tensor_bytes'] / GIB:.2f} GiB per tensor")
    print(f"measured (one K3-width layer, context T={args.context}, CPU):")
    m = measured(args.context)
    layers = 5
    anchor = m["per_anchor_block_shared_bytes"] + layers * m["per_anchor_block_per_layer_bytes"]
    row = m["per_context_row_shared_bytes"] + layers * m["per_context_row_per_layer_bytes"]
    print(f"  per anchor block (7 rows): {m['per_anchor_block_per_layer_bytes'] / 2**20:.2f} MiB per layer + "
          f"{m['per_anchor_block_shared_bytes'] / 2**20:.2f} MiB shared -> {anchor / 2**20:.1f} MiB for 5 layers")
    print(f"  per context row: {m['per_context_row_per_layer_bytes'] / 2**10:.1f} KiB per layer + "
          f"{m['per_context_row_shared_bytes'] / 2**10:.1f} KiB shared -> {row / 2**10:.1f} KiB for 5 layers")
    m.update(per_anchor_block_bytes_5_layers=anchor, per_context_row_bytes_5_layers=row)
    if args.json:
        args.json.write_text(json.dumps({"computed": c, "measured": m}, indent=2) + "\n")


if __name__ == "__main__":
    main()
