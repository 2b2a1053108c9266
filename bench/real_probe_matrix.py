"""The probe's matrix on trained drafts: each convention mistake made as a user would, and the untrained base.

Usage:
    python bench/real_probe_matrix.py RUN [--prompts P.jsonl | --data DIR] [--max-new-tokens N] [--work W]
                                          [--formats k3,spec] [--threads N] [--force] [--json OUT]

RUN is a run folder as bench/real_recipe.py and tests/real_drafts.py write it (`k3-draft`, `k3-base`,
`spec-draft`, `spec-base`; a format whose draft is absent is skipped). For each format, the trained draft, every
mutant of bench/_probe_matrix.py (written into W) and the untrained base are planned (`probe.plan_probe`); the
target runs once for all of them, on the union of the layers they tap (the default prompts, or --prompts, or the
sequences of --data), and each is judged on those paths (`probe.judge`). The script prints the matrix (each
convention's verdict; a wrong one marked WRONG), the time of the paths and of each judgement, and writes the
verdicts with their numbers to --json. The target defaults to .ci/real-target.sh's float32 folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _mistakes import target_layers  # noqa: E402
from _probe_matrix import CONVENTIONS, matches, mutants, verdict_of  # noqa: E402

WORLD = Path(os.environ.get("DSPARK_WORLD_CACHE", Path.home() / ".cache" / "dspark-hub")) / "smollm2-135m-instruct"
FOLDERS = {"k3": ("k3-draft", "k3-base"), "spec": ("spec-draft", "spec-base")}


def run_format(run: Path, fmt: str, target_path: Path, work: Path, args: argparse.Namespace,
               before: list[dict]) -> list[dict]:
    """Every row of one format, judged on one set of paths; --json is rewritten after each row (`before`: the
    rows of the formats already done), so a long run keeps what it measured."""
    from dspark_hub.train.evaluation.greedy_paths import greedy_paths
    from dspark_hub.train.evaluation.probe import DEFAULT_PROMPTS, judge, plan_probe
    from dspark_hub.train.target.target import Target

    trained, base = (run / name for name in FOLDERS[fmt])
    target = Target.open(target_path)
    work.mkdir(parents=True)
    rows = mutants(trained, base if base.is_dir() else None, work, target_layers(target_path))
    plans = {row.name: plan_probe(row.draft, target, block_size=row.block_size) for row in rows}
    layers = set().union(*(plan.layers for plan in plans.values()))
    longest = max(plan.longest for plan in plans.values())
    started = time.perf_counter()
    prompts = None if args.data else (args.prompts or DEFAULT_PROMPTS)
    paths = greedy_paths(target, layers, prompts=prompts, data=args.data,
                         max_new_tokens=args.max_new_tokens + longest)
    print(f"{fmt}: target paths {time.perf_counter() - started:.1f} s ({len(paths)} paths, {len(layers)} layers)",
          flush=True)
    out = []
    for row in rows:
        started = time.perf_counter()
        # every row on the anchors of the longest block any row serves, so all rows see the same anchors
        result = judge(plans[row.name], [p for p in paths], data=str(args.data or prompts))
        seconds = time.perf_counter() - started
        verdicts = {key: verdict_of(result, key) for key in CONVENTIONS}
        wrong = [key for key in CONVENTIONS if not matches(row.truth, result, key)]
        out.append({"format": fmt, "row": row.name, "verdicts": verdicts, "wrong": wrong, "seconds": round(seconds, 1),
                    "untrained": result.untrained.to_dict(), "anchors": result.anchors, "result": result.to_dict()})
        if args.json:
            args.json.write_text(json.dumps(before + out, indent=2) + "\n")
        print(f"{fmt} {row.name}: {seconds:.1f} s, " + ", ".join(f"{k} {v}" for k, v in verdicts.items() if v != "-")
              + (f"  WRONG: {wrong}" if wrong else ""), flush=True)
    return out


def table(rows: list[dict]) -> str:
    titles = {"taps": "taps", "slot_layout": "slot layout", "final_norm": "final norm", "d2t": "d2t",
              "markov": "Markov head", "block": "block", "rope": "RoPE"}
    lines = ["| draft | row | " + " | ".join(titles[k] for k in CONVENTIONS) + " | untrained level (ratio, z) |",
             "| --- | --- | " + " | ".join("---" for _ in CONVENTIONS) + " | --- |"]
    for row in rows:
        cells = [row["verdicts"][k] + (" WRONG" if k in row["wrong"] else "") for k in CONVENTIONS]
        level = row["untrained"]
        ratio = "-" if level["ratio"] is None else f"{level['ratio']:.1f}x"
        z = "-" if level["z"] is None else f"{level['z']:+.1f}"
        lines.append(f"| {row['format']} | {row['row']} | " + " | ".join(cells)
                     + f" | {'above' if level['above'] else 'AT'} ({ratio}, z {z}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--target", type=Path, default=WORLD / "f32")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompts", type=Path, help="prompts the target continues [the probe's default set]")
    source.add_argument("--data", type=Path, help="a rollouts folder: its sequences as they are")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--work", type=Path, default=None, help="where the mutants go [RUN/probe-matrix]")
    parser.add_argument("--formats", default="k3,spec")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--force", action="store_true", help="replace the work folder")
    parser.add_argument("--json", type=Path, help="also write every row's verdicts and numbers here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    work = args.work or args.run / "probe-matrix"
    if work.exists():
        if not args.force:
            sys.exit(f"real_probe_matrix: {work} exists; pass --force to replace it")
        shutil.rmtree(work)
    rows: list[dict] = []
    for fmt in (f.strip() for f in args.formats.split(",") if f.strip()):
        if (args.run / FOLDERS[fmt][0]).is_dir():
            rows += run_format(args.run, fmt, args.target, work / fmt, args, rows)
    print(table(rows))
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")


if __name__ == "__main__":
    main()
