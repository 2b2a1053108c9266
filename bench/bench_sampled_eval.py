"""A sampled `eval` (`--temperature`, the default samples) against the greedy eval of the same prompts.

Usage: python bench/bench_sampled_eval.py DRAFT PROMPTS [--target DIR] [--temperature 1.0] [--samples N]
                                          [--max-new-tokens 96] [--runs 5] [--threads 1] [--out DIR]

DRAFT is a trained draft and PROMPTS the held-out prompts, for example `bench/real_recipe.py`'s OUT/spec-draft
(or OUT/k3-draft) and OUT/heldout.jsonl (40 SmolLM2 prompts). Both evals run whole in this process, from the
prompts (the target's continuations, the draft, the prompt-lookup baseline), alternately, `--runs` rounds;
prints each round, the AL of both, and the median ratio sampled / greedy. The requirement (issue 31): at
most 3 at the default sample count. `--out DIR` keeps the last round's two `eval --json` documents there
(sampled.json, greedy.json).
"""

from __future__ import annotations

import argparse
import json
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
    parser.add_argument("prompts", type=Path)
    parser.add_argument("--target", type=Path, default=WORLD / "f32")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--samples", type=int, help="samples a prompt [eval's default]")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="keep the last round's eval documents in this folder")
    args = parse_rounds(parser)
    import torch

    from dspark_hub.train.evaluation.decoding import eval_sampling
    from dspark_hub.train.evaluation.evaluate import evaluate

    torch.set_num_threads(args.threads)
    sampled = eval_sampling(args.temperature, samples=args.samples)
    print(f"{args.draft}: {sampled.describe()} against greedy, {args.max_new_tokens} new tokens, "
          f"{args.threads} thread(s), load average {os.getloadavg()[0]:.1f}", flush=True)

    def run(name, sampling):  # type: ignore[no-untyped-def]
        def measure() -> dict:
            doc = evaluate(args.draft, target=str(args.target), prompts=str(args.prompts),
                           max_new_tokens=args.max_new_tokens, sampling=sampling).to_dict()
            print(f"  {sampling.describe()}: AL {doc['acceptance_length']:.4f} over {doc['drafts']} drafts"
                  + (f", interval +-{doc['intervals']['half_width']:.4f}" if doc["intervals"] else ""), flush=True)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
            return doc
        return measure

    alternate(("sampled", run("sampled", sampled)), ("greedy", run("greedy", eval_sampling())), args.runs,
              same=lambda a, b: a["prompts"] == b["prompts"])


if __name__ == "__main__":
    main()
