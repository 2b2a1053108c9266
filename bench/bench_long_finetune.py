"""Long fine-tunes: kernel time, step time and peak memory of `finetune`, before and after its allocator settings.

Usage:
    python bench/bench_long_finetune.py WORK [--runs 5] [--spec-steps 300] [--k3-steps 100] [--formats spec,k3]
                                            [--threads 1] [--table-from JSON]

The world is the SmolLM2 recipe's (docs/real-model.md), built in WORK by the recipe's own commands when it
is not there yet (`bench/real_recipe.py`'s steps: both bases, the 200 train prompts' rollouts from the BF16
target). Each format trains with the recipe's `finetune` command (`real_recipe.draft_steps`: 8 sequences, 16
anchors a k3_dspark sequence and 16 over the speculators draft's packed row (`--anchors 2`), `--loss '{"kl": 1}'
--gamma 2 --lr 3e-3 --dtype bfloat16`, `--loss-chunk 0` for k3_dspark), one
`dspark-hub finetune` process per run:

- before: `DSPARK_ALLOCATOR=system`, glibc's and oneDNN's defaults (what `finetune` did before);
- after: `finetune` as it is (`train/finetuning/allocator.py`: heap kept, no trim, oneDNN caches capped).

The two alternate, the order flipped every round. Per run: the median of the log's `step_seconds` (every step
after the first 10), the system share of the child's CPU time (`os.wait4`'s rusage: system / (user + system),
start-up included), its CPU seconds per step (user + system over the steps, start-up included: what the load
moves least), its minor page faults per step, its peak RSS, and the log's `peak_memory_bytes` at 1/10
of the run and at the end (how flat it stays). Printed per format: the median of each over the runs, the median
of the per-round ratios of step time (before / after, > 1 = after faster), whether both trained the same
losses, and the load average, since other work on a shared machine moves every number. Each round is also
appended to WORK/bench_long_finetune-rounds.jsonl as it ends, so a stopped bench keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_recipe

MIN_RUNS = 5
SKIPPED_STEPS = 10           # the first steps build oneDNN's kernels and grow the heap: not the steady step
WAYS = {"before": {"DSPARK_ALLOCATOR": "system"}, "after": {}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--runs", type=int, default=MIN_RUNS)
    parser.add_argument("--spec-steps", type=int, default=300)
    parser.add_argument("--k3-steps", type=int, default=100)
    parser.add_argument("--formats", default="spec,k3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target", type=Path, default=real_recipe.WORLD / "f32")
    parser.add_argument("--train-target", type=Path, default=real_recipe.WORLD / "bf16")
    parser.add_argument("--table-from", type=Path, metavar="JSON", help="print the table of an earlier run's JSON")
    args = parser.parse_args(argv)
    if args.runs < MIN_RUNS:
        parser.error(f"--runs {args.runs}: a median needs at least {MIN_RUNS} alternating rounds")
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not args.formats or set(args.formats) - set(real_recipe.FORMATS):
        parser.error(f"--formats: a comma-separated subset of {', '.join(real_recipe.FORMATS)}")
    return args


def recipe_args(args: argparse.Namespace, steps: int) -> argparse.Namespace:
    """The namespace `real_recipe`'s step builders read: the full recipe's settings, `steps` steps."""
    return argparse.Namespace(**{**real_recipe.FULL, "steps": steps, "k3_steps": steps, "lr": 3e-3,
                                 "loss": '{"kl": 1}', "gamma": 2.0, "draft_vocab": 8192,
                                 "rollouts_engine": "transformers", "vllm_python": None, "ci": False, "taps": None,
                                 "target": args.target,
                                 "train_target": args.train_target})


def build_world(args: argparse.Namespace) -> None:
    """Both bases and the train rollouts in WORK, each made by the recipe's command unless already there."""
    work, recipe = args.work, recipe_args(args, 1)
    work.mkdir(parents=True, exist_ok=True)
    real_recipe.first_lines(real_recipe.PROMPTS / "smollm2-train.jsonl", recipe.train, work / "train.jsonl")
    real_recipe.first_lines(real_recipe.PROMPTS / "smollm2-heldout.jsonl", recipe.heldout, work / "heldout.jsonl")
    threads = ["--threads", str(args.threads)]
    steps = [real_recipe.init_k3_step(recipe, work), real_recipe.rollout_steps(recipe, work, threads)[0]]
    made = [work / "k3-base", work / "train-data" / "manifest.json"]
    for (name, command), output in zip(steps, made, strict=True):
        if not output.exists():
            real_recipe.run_step(name, real_recipe.CLI + command, work / f"{name.replace(' ', '-')}.log")
    if not (work / "spec-base").exists():
        taps = ",".join(str(t) for t in json.loads((work / "k3-base" / "config.json").read_text())["target_layer_ids"])
        name, command = real_recipe.init_spec_step(recipe, work, taps)
        real_recipe.run_step(name, real_recipe.CLI + command, work / "init-spec.log")


def finetune_command(args: argparse.Namespace, fmt: str, out: Path) -> list[str]:
    """The recipe's `finetune` of `fmt`, writing to `out`, with --json."""
    steps = args.spec_steps if fmt == "spec" else args.k3_steps
    name, command = real_recipe.draft_steps(recipe_args(args, steps), args.work, fmt,
                                            ["--threads", str(args.threads)])[0]
    assert name == f"finetune {fmt}"
    command[command.index("--out") + 1] = str(out)
    return [*real_recipe.CLI, *command, "--json", "--quiet"]


def one_run(command: list[str], env: dict[str, str], out: Path) -> dict[str, Any]:
    """Run one finetune process; what it measured (see the module docstring)."""
    printed, errors = out.with_suffix(".json"), out.with_suffix(".err")
    with printed.open("w") as stdout, errors.open("w") as stderr:
        process = subprocess.Popen(command, env={**os.environ, **env}, stdout=stdout, stderr=stderr,
                                   cwd=real_recipe.ROOT)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        sys.exit(f"bench_long_finetune: {' '.join(command)} failed:\n{errors.read_text(errors='replace')[-2000:]}")
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    steps = [entry for entry in log if "loss" in entry]
    cpu = usage.ru_utime + usage.ru_stime
    return {"step_seconds": statistics.median(e["step_seconds"] for e in steps[SKIPPED_STEPS:]),
            "system_share": usage.ru_stime / cpu if cpu else 0.0, "user_seconds": usage.ru_utime,
            "system_seconds": usage.ru_stime, "faults_per_step": usage.ru_minflt / len(steps),
            "peak_rss_mib": usage.ru_maxrss / 1024,
            "peak_early_mib": steps[len(steps) // 10]["peak_memory_bytes"] / 2**20,
            "peak_end_mib": steps[-1]["peak_memory_bytes"] / 2**20,
            "losses": [e["loss"] for e in steps], "final_loss": json.loads(printed.read_text())["final_loss"]}


def bench_format(args: argparse.Namespace, fmt: str) -> dict[str, Any]:
    rounds: list[dict[str, dict[str, Any]]] = []
    for round_ in range(args.runs):
        measured = {}
        for way in list(WAYS)[:: 1 if round_ % 2 == 0 else -1]:
            out = args.work / f"bench-{fmt}-{way}"
            measured[way] = one_run(finetune_command(args, fmt, out), WAYS[way], out)
        rounds.append(measured)
        kept = {way: {key: value for key, value in m.items() if key != "losses"} for way, m in measured.items()}
        with (args.work / "bench_long_finetune-rounds.jsonl").open("a") as log:   # a stopped bench keeps its rounds
            entry = {"format": fmt, "round": round_ + 1, "load_average": os.getloadavg()[0], **kept}
            log.write(json.dumps(entry) + "\n")
        before, after = measured["before"], measured["after"]
        print(f"{fmt} round {round_ + 1}: step {before['step_seconds']:.3f} s -> {after['step_seconds']:.3f} s, "
              f"system {before['system_share']:.1%} -> {after['system_share']:.1%}, peak "
              f"{before['peak_rss_mib']:,.0f} -> {after['peak_rss_mib']:,.0f} MiB, same losses: "
              f"{before['losses'] == after['losses']}; load average {os.getloadavg()[0]:.1f}", flush=True)
    summary: dict[str, Any] = {"steps": args.spec_steps if fmt == "spec" else args.k3_steps, "runs": args.runs}
    for way in WAYS:
        runs = [r[way] for r in rounds]
        summary[way] = {key: statistics.median(run[key] for run in runs)
                        for key in runs[0] if key not in ("losses", "final_loss")}
    ratios = [r["before"]["step_seconds"] / r["after"]["step_seconds"] for r in rounds]
    summary["step_ratio"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    summary["same_losses"] = all(r["before"]["losses"] == r["after"]["losses"] for r in rounds)
    return summary


def print_table(results: dict[str, dict[str, Any]]) -> None:
    print("| format | steps | | step (s) | CPU s a step | system share | minor faults a step | peak RSS (MiB) | "
          "log peak at 1/10 -> end (MiB) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for fmt, summary in results.items():
        for way in WAYS:
            m = summary[way]
            cpu = (m["user_seconds"] + m["system_seconds"]) / summary["steps"]
            print(f"| {real_recipe.FORMATS[fmt]} | {summary['steps']} | {way} | {m['step_seconds']:.3f} | {cpu:.3f} | "
                  f"{m['system_share']:.1%} | {m['faults_per_step']:,.0f} | {m['peak_rss_mib']:,.0f} | "
                  f"{m['peak_early_mib']:,.0f} -> {m['peak_end_mib']:,.0f} |")
    for fmt, summary in results.items():
        ratio = summary["step_ratio"]
        print(f"{real_recipe.FORMATS[fmt]}: median step ratio before / after over {summary['runs']} rounds "
              f"{ratio['median']:.2f} (min {ratio['min']:.2f}, max {ratio['max']:.2f}); same losses: "
              f"{summary['same_losses']}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.table_from:
        print_table(json.loads(args.table_from.read_text()))
        return
    if not (args.train_target / "config.json").is_file():
        sys.exit(f"bench_long_finetune: {args.train_target} has no config.json; build the world: .ci/real-target.sh")
    build_world(args)
    results = {fmt: bench_format(args, fmt) for fmt in args.formats}
    (args.work / "bench_long_finetune.json").write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"load average {os.getloadavg()}; wrote {args.work / 'bench_long_finetune.json'}")


if __name__ == "__main__":
    main()
