"""The real recipe on SmolLM2-135M-Instruct: init --target, rollouts, finetune, eval (docs/real-model.md).

Usage:
    python bench/real_recipe.py OUT [--target DIR] [--train N] [--heldout N] [--max-new-tokens N] [--steps N]
                                    [--engine transformers|vllm] [--engine-python PY] [--threads N] [--ci]

Each step is one `dspark-hub` command run as written in the docs, in its own process; the script
records its wall time and peak resident memory (os.wait4's ru_maxrss: the largest of that process and
the processes it reaped, so a vLLM engine process is counted on its own, not added), then prints a table and
writes OUT/recipe.json. The k3_dspark draft is sized by `init --target`, trained on rollouts of the
train prompts, and measured (simulated, vLLM's verify loop) on rollouts of the held-out prompts,
against the untrained draft (`--reference`) and prompt lookup (eval's n-gram baseline).

`--ci` is the CI-sized run: 24 train and 8 held-out prompts, 48 new tokens, 30 steps of 4 sequences x 8 anchors.
TARGET defaults to the f32 folder `.ci/real-target.sh` builds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "prompts"
WORLD = Path(os.environ.get("DSPARK_WORLD_CACHE", Path.home() / ".cache" / "dspark-hub")) / "smollm2-135m-instruct"
CLI = [sys.executable, "-m", "dspark_hub"]


def first_lines(src: Path, n: int, dst: Path) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines()[:n]
    dst.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return dst


def run_step(name: str, args: list[str], log: Path) -> dict[str, object]:
    """Run one command; its wall seconds, peak RSS (MiB) and exit code. stdout goes to `log`, stderr beside it."""
    start = time.perf_counter()
    with log.open("w") as out, log.with_suffix(".err").open("w") as err:
        process = subprocess.Popen(args, stdout=out, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    process.returncode = code
    step = {"step": name, "seconds": round(seconds, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024),
            "exit": code, "command": " ".join(args[2:])}
    print(f"{name}: {seconds:.1f} s, peak {step['peak_rss_mib']} MiB, exit {code}", flush=True)
    if code != 0:
        sys.exit(f"real_recipe: {name} failed (exit {code}); see {log}")
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--target", type=Path, default=WORLD / "f32")
    parser.add_argument("--train", type=int, default=200)
    parser.add_argument("--heldout", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--anchors", type=int, default=16, help="finetune --anchors: anchors per sequence")
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--engine-python", help="vllm: the vLLM virtualenv's python ($(.ci/venv-vllm.sh))")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--ci", action="store_true", help="the CI-sized run")
    args = parser.parse_args()
    if args.ci:
        args.train, args.heldout, args.max_new_tokens, args.steps, args.batch_size, args.anchors = 24, 8, 48, 30, 4, 8
    if not (args.target / "config.json").is_file():
        sys.exit(f"real_recipe: {args.target} has no config.json; build the world: .ci/real-target.sh")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    train = first_lines(PROMPTS / "smollm2-train.jsonl", args.train, out / "train.jsonl")
    heldout = first_lines(PROMPTS / "smollm2-heldout.jsonl", args.heldout, out / "heldout.jsonl")
    target = str(args.target)
    threads = ["--threads", str(args.threads)] if args.threads else []
    engine = ["--engine", args.engine] + (["--engine-python", args.engine_python] if args.engine_python else [])
    rollout = ["--max-new-tokens", str(args.max_new_tokens), "--batch-size", "16", *engine, *threads, "--force"]
    steps = [
        ("init", ["init", str(out / "base"), "--target", target, "--force"]),
        ("rollouts train", ["rollouts", "--teacher", target, "--prompts", str(train), "--draft-config",
                            str(out / "base" / "config.json"), "--out", str(out / "train-data"), *rollout]),
        ("rollouts held-out", ["rollouts", "--teacher", target, "--prompts", str(heldout), "--draft-config",
                               str(out / "base" / "config.json"), "--out", str(out / "heldout-data"), *rollout]),
        ("finetune", ["finetune", "--base", str(out / "base"), "--data", str(out / "train-data"), "--teacher", target,
                      "--out", str(out / "draft"), "--steps", str(args.steps), "--batch-size", str(args.batch_size),
                      "--anchors", str(args.anchors),
                      "--warmup", str(max(1, args.steps // 20)), "--lr", "1e-3", *threads, "--force"]),
        ("eval", ["eval", "--draft", str(out / "draft"), "--data", str(out / "heldout-data"), "--reference",
                  str(out / "base"), "--json", *threads]),
    ]
    record = []
    for name, command in steps:
        record.append(run_step(name, CLI + command, out / f"{name.replace(' ', '-')}.log"))
    result = json.loads((out / "eval.log").read_text())
    summary = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "target")},
        "children_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
        "steps": record,
        "acceptance": {
            "trained": _al(result), "untrained base": _al(result["reference"]),
            "prompt lookup": _al(result["baseline"]),
        },
        "by_dataset": {name: {"trained": _al(d), "untrained base": _al(d["reference"]) if d.get("reference") else None,
                              "prompt lookup": _al(d["baseline"]) if d.get("baseline") else None}
                       for name, d in result["by_dataset"].items()},
        "drafts": result["drafts"], "k": result["k"],
    }
    (out / "recipe.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, stats in summary["acceptance"].items():
        print(f"{name}: AL {stats['acceptance_length']:.3f}, per position {stats['per_position']}")
    print(f"total {sum(s['seconds'] for s in record):.0f} s; wrote {out / 'recipe.json'}")


def _al(stats: dict[str, object]) -> dict[str, object]:
    per = stats["per_position"]
    return {"acceptance_length": round(float(stats["acceptance_length"]), 4),  # type: ignore[arg-type]
            "per_position": [round(float(a), 3) for a in per]}  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
