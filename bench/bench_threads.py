"""One torch thread against torch's default (one per core) for `finetune` steps and `rollouts`, on this machine now.

Usage: python bench/bench_threads.py [--repeat N] [--steps N] [--prompts N]

Builds the tiny world once (the tiny config's random Llama teacher, a tiny-profile draft, 64 rollouts of
16 + 112 tokens), then runs alternating rounds; in each round both thread counts run the same work in
fresh processes (the thread count is set before any torch work, as `--threads` does):

- finetune: `--steps` optimizer steps (batch 8, 64 anchors per sequence), timed by the trainer itself
  (supervised tokens per second, imports excluded);
- rollouts: `--prompts` greedy continuations of 112 tokens by the transformers engine (wall time of the
  call, imports excluded).

Rounds alternate so the two counts share whatever else loads the machine; the report is the median of the
per-round ratios (default / one thread: above 1 means one thread is faster), with the load average seen.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_REPEAT = 5


def child(kind: str, root: Path, threads: int | None, steps: int, prompts: int) -> float:
    """Seconds of the work (one process, `threads` torch threads or torch's default)."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    if kind == "finetune":
        from dspark_hub.train import TrainConfig, finetune

        config = TrainConfig(base=str(root / "base"), out=str(root / f"out-{threads}"), data=str(root / "data"),
                             steps=steps, batch_size=8, max_anchors=64, target=str(root / "teacher"), force=True)
        return finetune(config).seconds
    from dspark_hub.train.data.rollouts import make_rollouts

    lines = (root / "p.jsonl").read_text().splitlines()[:prompts]
    (root / "some.jsonl").write_text("".join(line + "\n" for line in lines))
    start = time.perf_counter()
    make_rollouts(root / "teacher", root / "some.jsonl", root / "base" / "config.json", root / f"r-{threads}",
                  max_new_tokens=112, ignore_eos=True, batch_size=8, force=True)
    return time.perf_counter() - start


def run_child(kind: str, root: Path, threads: int | None, steps: int, prompts: int) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    args = [sys.executable, __file__, "--child", kind, "--world", str(root), "--steps", str(steps),
            "--prompts", str(prompts)] + (["--threads", str(threads)] if threads else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def round_ratios(default: list[float], one: list[float]) -> tuple[float, float, float]:
    """(median, min, max) of the per-round time ratios default / one thread."""
    ratios = [d / o for d, o in zip(default, one, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=MIN_REPEAT, help=f"alternating rounds (at least {MIN_REPEAT})")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--child", choices=["finetune", "rollouts"], help=argparse.SUPPRESS)
    parser.add_argument("--world", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child:
        print(child(args.child, args.world, args.threads, args.steps, args.prompts))
        return
    if args.repeat < MIN_REPEAT:
        parser.error(f"--repeat: at least {MIN_REPEAT} rounds (a median of fewer says little under load)")
    import torch

    print(f"cores {os.cpu_count()}, torch default {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_train import tiny_world

        tiny_world(root)
        for kind in ("finetune", "rollouts"):
            default, one = [], []
            for i in range(args.repeat):
                pair = [(None, default), (1, one)] if i % 2 == 0 else [(1, one), (None, default)]
                for threads, into in pair:
                    into.append(run_child(kind, root, threads, args.steps, args.prompts))
            median, low, high = round_ratios(default, one)
            print(f"{kind}: default {statistics.median(default):.2f} s, one thread {statistics.median(one):.2f} s "
                  f"(medians of {args.repeat}); default / one thread per round: median {median:.2f} "
                  f"(min {low:.2f}, max {high:.2f}); load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
