"""The simulated `eval` of a k3_dspark draft: requests drafted in lockstep against one request at a time.

Usage: python bench/bench_eval_lockstep.py DRAFT DATA [--target DIR] [--rollouts N] [--runs 5] [--threads N]

DRAFT is a k3_dspark draft and DATA a held-out rollouts folder at its taps, for example `bench/real_recipe.py`'s
OUT/k3-draft and OUT/heldout-data. Until 2026-12-02 the simulation drafted one request at a time, so every
step read the target's whole vocabulary projection and the Markov head for a few rows. Now
`acceptance.measure_batched` drafts one step of every unfinished request in one call. Both ways run in this
process on the same draft and rollouts, alternately, `--runs` rounds; the old way is `acceptance.measure`
with the per-rollout `draft_proposer`. Prints each round, the median ratio old / new, and checks that both
give the same counts.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from _alternate import WORLD, alternate, parse_rounds  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draft", type=Path)
    parser.add_argument("data", type=Path)
    parser.add_argument("--target", type=Path, default=WORLD / "f32", help="the target whose lm_head drafts")
    parser.add_argument("--rollouts", type=int, default=16, help="the first N held-out rollouts")
    parser.add_argument("--threads", type=int, default=1)
    args = parse_rounds(parser)
    import torch

    from dspark_hub.modeling import load_checkpoint
    from dspark_hub.train.data.rollouts import RolloutData
    from dspark_hub.train.evaluation.acceptance import measure_batched
    from dspark_hub.train.evaluation.drafters import draft_batch_proposer, draft_proposer, measure
    from dspark_hub.train.evaluation.inputs import read_draft
    from dspark_hub.train.target.target import Target

    torch.set_num_threads(args.threads)
    k = read_draft(args.draft).k
    model = load_checkpoint(args.draft, dtype=torch.float32).model
    model.train(False)
    lm_head = Target.open(args.target).lm_head().float()
    rollouts = list(itertools.islice(iter(RolloutData(args.data)), args.rollouts))
    print(f"{len(rollouts)} rollouts, k {k}, {args.threads} thread(s), load average {os.getloadavg()[0]:.1f}")
    with torch.no_grad():
        alternate(("one at a time", lambda: measure(rollouts, lambda r: draft_proposer(model, lm_head, r, k),
                                                    k).to_dict()),
                  ("lockstep", lambda: measure_batched(rollouts, lambda c: draft_batch_proposer(model, lm_head, c, k),
                                                       k).to_dict()),
                  args.runs, same=lambda a, b: a == b)


if __name__ == "__main__":
    main()
