"""Loss memory at the K3 vocabulary: chunked (`objective.chunked_loss_sums`) vs whole (`objective.loss_sums`).

Usage: python bench/bench_loss_memory.py [--anchors 64] [--block 7] [--hidden 256] [--chunks 409,64,16]
                                         [--repeats 3] [--threads N]

One sequence of `anchors x block` (anchor, position) rows, the K3 draft vocabulary (163,840), a
small hidden size. Each variant runs in a fresh subprocess (so peaks do not mix): it builds the
heads the loss touches (lm_head, Markov head, confidence head), then times forward + backward of
the loss (ce + tv + confidence, gradients to the hidden rows and the heads) `--repeats` times.
Peak memory is `resource.getrusage(RUSAGE_SELF).ru_maxrss` (CPU tensors are invisible to
torch.cuda); "loss peak" is that peak minus the resident size just before the first loss.
The whole-vocabulary variant is the peer (`--loss-chunk 0`, what `finetune` did before chunking).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _reference import env

from dspark_hub.format import contract
from dspark_hub.train.finetuning import objective

TERMS = {"ce": 0.1, "tv": 0.9}


def resident_kib() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() // 1024


def measure(chunk_rows: int, anchors: int, block: int, hidden_size: int, repeats: int, threads: int) -> dict:
    """One variant, in this process: the numbers the parent prints."""
    from types import SimpleNamespace

    import torch

    from dspark_hub.modeling import K3DSparkConfig, K3DSparkModel
    from dspark_hub.train.finetuning.trainer import chunkable_draft_logits

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = {**contract.REFERENCE_CONFIG, "hidden_size": hidden_size, "target_hidden_size": hidden_size,
              "num_hidden_layers": 1, "intermediate_size": 2 * hidden_size, "num_attention_heads": 2,
              "num_key_value_heads": 2, "q_lora_rank": 64, "kv_lora_rank": 32}
    model = K3DSparkModel(K3DSparkConfig(**config)).float().train()
    model.embed_tokens.weight.requires_grad_(False)
    vocab = config["draft_vocab_size"]
    lm_head = torch.randn(vocab, hidden_size) * hidden_size ** -0.5
    seq = anchors + block + 1
    starts = torch.randperm(seq - block)[:anchors].sort().values
    positions = (starts[:, None] + torch.arange(block))[None]                      # [1, A, K]
    tokens = torch.randint(0, vocab, (1, seq))
    labels, prev_ids = tokens[0, positions + 1], tokens[0, positions]
    hidden = torch.randn(1, anchors, block, hidden_size, requires_grad=True)
    batch = SimpleNamespace(final_hidden=torch.randn(1, seq, hidden_size).to(torch.bfloat16),
                            loss_mask=torch.ones(1, seq, dtype=torch.bool))

    def step() -> float:
        confidence = model.confidence_logits(hidden, prev_ids)
        if chunk_rows:
            draft_logits, inputs = chunkable_draft_logits(model, lm_head, hidden, prev_ids)
            sums = objective.chunked_loss_sums(draft_logits, inputs, confidence, labels, positions, batch, lm_head,
                                               terms=list(TERMS), gamma=4.0, chunk_rows=chunk_rows)
        else:
            logits = model.draft_logits(hidden, lm_head, prev_ids)
            sums = objective.loss_sums(logits, confidence, labels, positions, batch, lm_head, terms=list(TERMS),
                                       gamma=4.0)
        loss = objective.combine(sums, TERMS, 1.0, sums.weight)
        loss.backward()
        model.zero_grad(set_to_none=True)
        hidden.grad = None
        return float(loss)

    before_kib, setup_peak_kib = resident_kib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds, losses = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        losses.append(step())
        seconds.append(time.perf_counter() - start)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"chunk_rows": chunk_rows, "rows": anchors * block, "vocab": vocab, "peak_kib": peak_kib,
            "before_kib": before_kib, "setup_peak_kib": setup_peak_kib, "seconds": statistics.median(seconds),
            "loss": losses[-1]}


def run_variant(chunk_rows: int, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", str(chunk_rows), "--anchors", str(args.anchors), "--block",
               str(args.block), "--hidden", str(args.hidden), "--repeats", str(args.repeats), "--threads",
               str(args.threads)]
    done = subprocess.run(command, env=env(), capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchors", type=int, default=64)
    parser.add_argument("--block", type=int, default=7)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--chunks", default=f"{objective.DEFAULT_LOSS_CHUNK},128,64,16",
                        help="comma-separated chunk sizes (rows) to compare with the whole-vocabulary loss")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.anchors, args.block, args.hidden, args.repeats, args.threads)))
        return

    variants = [0] + [int(c) for c in args.chunks.split(",")]
    results = [run_variant(chunk, args) for chunk in variants]
    whole = results[0]
    mib = 1024
    print(f"loss forward+backward: {whole['rows']} rows ({args.anchors} anchors x {args.block}), vocabulary "
          f"{whole['vocab']:,}, hidden {args.hidden}, {args.threads} threads, median of {args.repeats}; "
          f"one float32 [rows, V] tensor = {whole['rows'] * whole['vocab'] * 4 / 2**20:,.0f} MiB")
    print(f"{'loss':<22}{'peak RSS MiB':>14}{'loss peak MiB':>15}{'x whole':>9}{'seconds':>10}{'x whole':>9}")
    whole_extra = whole["peak_kib"] - whole["before_kib"]
    for r in results:
        extra = r["peak_kib"] - r["before_kib"]
        name = "whole (--loss-chunk 0)" if not r["chunk_rows"] else f"chunked, {r['chunk_rows']} rows"
        print(f"{name:<22}{r['peak_kib'] / mib:>14,.0f}{extra / mib:>15,.0f}{extra / whole_extra:>9.3f}"
              f"{r['seconds']:>10.3f}{r['seconds'] / whole['seconds']:>9.3f}")
        if abs(r["loss"] - whole["loss"]) > 1e-4 * abs(whole["loss"]):
            print(f"  loss differs from the whole-vocabulary loss: {r['loss']} vs {whole['loss']}")
    print("setup peak before the loss (MiB): " + ", ".join(f"{r['setup_peak_kib'] / mib:,.0f}" for r in results))


if __name__ == "__main__":
    main()
