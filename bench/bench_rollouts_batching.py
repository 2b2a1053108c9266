"""`rollouts` batching on the real target: one left-padded `generate` per batch against one per prompt length.

Usage: python bench/bench_rollouts_batching.py [--target DIR] [--prompts N] [--new-tokens N] [--runs 5]

The SmolLM2 prompt set has about 20 prompt lengths in 200 prompts. Until 2026-12-01 `rollouts` batched only
prompts of equal length (no padding), so most `generate` calls carried one to three prompts. Now it
left-pads up to `--batch-size` prompts of any length into one call and captures the states without
padding. Both ways run in this process on the same model and prompts, alternately, `--runs` rounds; the
old way is `generate_rollouts` called once per prompt length (exactly what it did). Prints each round, the
median ratio old / new, and checks that both give the same tokens and states.

Run on the shared 2-core machine with the bf16 world: see docs/real-model.md for the measured numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from _alternate import WORLD, alternate, parse_rounds  # noqa: E402

TAPS = [1, 7, 14, 22, 27]


def prompts_of(target: Path, count: int) -> list:
    """The first `count` train prompts, through the target's chat template (as `rollouts` reads them)."""
    import tempfile

    from dspark_hub.train.data.rollouts import read_prompts

    lines = (ROOT / "bench" / "prompts" / "smollm2-train.jsonl").read_text(encoding="utf-8").splitlines()[:count]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prompts.jsonl"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return read_prompts(path, target)


def per_length(model, prompts: list, new_tokens: int) -> list:
    from dspark_hub.train.target.generate import generate_rollouts

    lengths = sorted({len(p.input_ids) for p in prompts})
    out = []
    for length in lengths:
        group = [p for p in prompts if len(p.input_ids) == length]
        out += generate_rollouts(model, group, TAPS, max_new_tokens=new_tokens, batch_size=len(prompts))
    return out


def together(model, prompts: list, new_tokens: int) -> list:
    from dspark_hub.train.target.generate import generate_rollouts

    return list(generate_rollouts(model, prompts, TAPS, max_new_tokens=new_tokens, batch_size=len(prompts)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=WORLD / "bf16")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=24)
    args = parse_rounds(parser)
    import torch

    from dspark_hub.train.target.target import load_target

    torch.set_num_threads(1)
    model = load_target(args.target)
    prompts = prompts_of(args.target, args.prompts)
    print(f"{len(prompts)} prompts of {len({len(p.input_ids) for p in prompts})} lengths, {args.new_tokens} new "
          f"tokens, {args.target.name}, 1 thread, load average {os.getloadavg()[0]:.1f}")

    def same(a: list, b: list) -> bool:
        return all(torch.equal(x.input_ids, y.input_ids) and torch.equal(x.aux_hidden_states, y.aux_hidden_states)
                   for x, y in zip(a, b, strict=True))

    def in_order(way):
        return lambda: sorted(way(model, prompts, args.new_tokens), key=lambda r: r.prompt_index)

    alternate(("per length", in_order(per_length)), ("together", in_order(together)), args.runs, same)


if __name__ == "__main__":
    main()
