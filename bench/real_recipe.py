"""The real recipe on SmolLM2-135M-Instruct, both formats, every step timed (docs/real-model.md).

Usage:
    python bench/real_recipe.py OUT [--ci] [--target DIR] [--vllm-python PY] [--rollouts-engine vllm] [--threads N]
                                    [--train N] [--heldout N] [--max-new-tokens N] [--steps N] [--batch-size N]
                                    [--anchors N] [--lr X] [--loss JSON] [--gamma X] [--draft-vocab N]

Each step is one `dspark-hub` command as the docs write it, in its own process; the script records its
wall time and peak resident memory (os.wait4's ru_maxrss: the largest of that process and the processes it
reaped, so a vLLM engine process is counted on its own, not added), prints a table and writes OUT/recipe.json.

1. `init --target`: a k3_dspark draft;
2. `rollouts` of the train prompts (greedy, the bfloat16 target) and of the held-out prompts (the float32
   target, whose greedy path vLLM's float32 run repeats), at the k3_dspark draft's taps, with the transformers
   engine or (`--rollouts-engine vllm`) vLLM's;
   then `init --target --format speculators` at the same taps (`--taps`), so one rollouts folder trains both,
   with a pruned vocabulary from the train rollouts' tokens;
3. `finetune` of each draft on the train rollouts (bfloat16 autocast, the bfloat16 target's lm_head);
4. `eval` (simulated, vLLM's verify loop, 7 drafted tokens a step) of each trained draft on the held-out
   rollouts, with the untrained draft as `--reference` and prompt lookup (eval's n-gram baseline) on the same
   continuations; with `--vllm-python`, `eval --engine vllm` of the trained speculators draft on the
   held-out prompts, served by vLLM (the k3_dspark draft needs vLLM's MLA path, GPUs only:
   bench/gpu_smoke_eval_vllm.py);
5. `verify --drop-in BASE --target T` and `card render` + `card lint` of each trained draft.

`--ci` is the CI-sized run, the one build the real-model tests share (tests/real_drafts.py runs it once a
session; tests/test_real_world.py checks its record, tests/test_real_mistakes.py and
tests/test_real_speculators_quality.py measure its drafts): 24 train and 8 held-out prompts, 48 new tokens,
everything on the float32 target, the drafts tapping 1,7,14,22,29 (the last the target's final layer, where the
norm matters), the speculators vocabulary from the train prompts, and each format's finetune as `CI_FINETUNE`
sets it. The full run: 200 and 40 prompts, 96 new tokens, 300 steps of 8 x 16; its speculators run draws
`--anchors` over its packed row of `--batch-size` sequences (`--anchors / --batch-size` a sequence: 8 x 2), the
supervision its numbers were measured with. The targets default to the folders `.ci/real-target.sh` builds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "prompts"
CARD = ROOT / "bench" / "real_card.yaml"
WORLD = Path(os.environ.get("DSPARK_WORLD_CACHE", Path.home() / ".cache" / "dspark-hub")) / "smollm2-135m-instruct"
CLI = [sys.executable, "-m", "dspark_hub"]
FORMATS = {"k3": "k3_dspark", "spec": "speculators"}
FULL = {"train": 200, "heldout": 40, "max_new_tokens": 96, "steps": 300, "batch_size": 8, "anchors": 16}
CI = {"train": 24, "heldout": 8, "max_new_tokens": 48, "steps": 40, "batch_size": 4, "anchors": 8}
#: The CI run's taps: the K3 recipe's spread, its last moved onto the final layer (29 of 30).
CI_TAPS = "1,7,14,22,29"
#: Each format's CI-sized finetune: the k3_dspark step scores the whole 49,152-token vocabulary (2.4 s at 4 x 8
#: anchors), the speculators one its pruned 8,192 (0.5 s at 8 sequences x 4 anchors, 32 a packed row), so the
#: speculators draft gets 150 steps. tests/test_real_mistakes.py's bounds were measured on these drafts.
CI_FINETUNE = {"k3": ["--steps", "30", "--batch-size", "4", "--anchors", "8", "--warmup", "2", "--lr", "3e-3",
                      "--loss", '{"kl": 1}'],
               "spec": ["--steps", "150", "--batch-size", "8", "--anchors", "4", "--warmup", "8", "--lr", "1e-3",
                        "--loss", '{"kl": 1}']}


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
        tail = "\n".join(log.with_suffix(".err").read_text(errors="replace").splitlines()[-5:])
        sys.exit(f"real_recipe: {name} failed (exit {code}); see {log}\n{tail}")
    return step


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--target", type=Path, default=WORLD / "f32",
                        help="the target in float32: held-out rollouts, eval, verify [.ci/real-target.sh's f32 folder]")
    parser.add_argument("--train-target", type=Path,
                        help="the same target in bfloat16, for train rollouts and finetune [its bf16 folder; --ci: "
                             "--target]")
    parser.add_argument("--taps", help="the k3_dspark draft's taps, e.g. 1,7,14,22,29 [init --target's; --ci: "
                                       f"{CI_TAPS}]")
    for key, value in FULL.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=None, help=f"[full: {value}]")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--k3-steps", type=int, help="finetune steps of the k3_dspark draft [--steps]")
    parser.add_argument("--loss", default='{"kl": 1}', help="finetune --loss")
    parser.add_argument("--gamma", type=float, default=2.0, help="finetune --gamma")
    parser.add_argument("--draft-vocab", type=int, default=8192, help="the speculators draft's pruned vocabulary")
    parser.add_argument("--vllm-python", help="also eval --engine vllm (the speculators drafts) in this vLLM venv")
    parser.add_argument("--rollouts-engine", choices=["transformers", "vllm"], default="transformers",
                        help="rollouts --engine (vllm: in the --vllm-python venv)")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--formats", default="k3,spec", help="which drafts: k3, spec or both (k3,spec)")
    parser.add_argument("--ci", action="store_true", help="the CI-sized run")
    args = parser.parse_args()
    for key, value in (CI if args.ci else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.ci:           # one build for every real-model test: the float32 target throughout, fixed taps
        args.train_target = args.target if args.train_target is None else args.train_target
        args.taps = CI_TAPS if args.taps is None else args.taps
    elif args.train_target is None:
        args.train_target = WORLD / "bf16"
    if args.rollouts_engine == "vllm" and not args.vllm_python:
        parser.error("--rollouts-engine vllm needs --vllm-python \"$(.ci/venv-vllm.sh)\"")
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if not args.formats or set(args.formats) - set(FORMATS):
        parser.error(f"--formats: a comma-separated subset of {', '.join(FORMATS)}")
    return args


def init_k3_step(args: argparse.Namespace, out: Path) -> tuple[str, list[str]]:
    taps = ["--taps", args.taps] if args.taps else []
    return "init k3", ["init", str(out / "k3-base"), "--target", str(args.train_target), *taps, "--force"]


def init_spec_step(args: argparse.Namespace, out: Path, taps: str) -> tuple[str, list[str]]:
    """The speculators draft at the k3_dspark draft's taps, its pruned vocabulary from the train rollouts (the CI run:
    from the train prompts)."""
    vocab_from = out / ("train.jsonl" if args.ci else "train-data")
    return "init spec", ["init", str(out / "spec-base"), "--target", str(args.train_target), "--format",
                         "speculators", "--taps", taps, "--draft-vocab", str(args.draft_vocab),
                         "--vocab-from", str(vocab_from), "--force"]


def rollout_steps(args: argparse.Namespace, out: Path, threads: list[str]) -> list[tuple[str, list[str]]]:
    engine = ["--engine", args.rollouts_engine]
    if args.rollouts_engine == "vllm":
        engine += ["--engine-python", args.vllm_python]
    common = ["--draft-config", str(out / "k3-base" / "config.json"), "--max-new-tokens", str(args.max_new_tokens),
              "--batch-size", "16" if args.ci else "100", *engine, *threads, "--force"]
    return [("rollouts train", ["rollouts", "--target", str(args.train_target), "--prompts", str(out / "train.jsonl"),
                                "--out", str(out / "train-data"), *common]),
            ("rollouts held-out", ["rollouts", "--target", str(args.target), "--prompts", str(out / "heldout.jsonl"),
                                   "--out", str(out / "heldout-data"), *common])]


def draft_steps(args: argparse.Namespace, out: Path, fmt: str, threads: list[str]) -> list[tuple[str, list[str]]]:
    base, draft, target = str(out / f"{fmt}-base"), str(out / f"{fmt}-draft"), str(args.target)
    steps_ = args.k3_steps if fmt == "k3" and args.k3_steps else args.steps
    # k3_dspark scores the target's whole 49,152-token vocabulary: one unchunked loss (~2 GiB) skips the
    # chunks' recomputation; the speculators draft's pruned vocabulary is 6x smaller.
    chunk = ["--loss-chunk", "0"] if fmt == "k3" else []
    # --anchors is per sequence for both formats; the speculators run keeps the supervision its numbers were
    # measured with (docs/real-model.md): args.anchors over the packed row of batch_size sequences.
    anchors = args.anchors if fmt == "k3" else max(1, args.anchors // args.batch_size)
    settings = CI_FINETUNE[fmt] if args.ci else [
        "--steps", str(steps_), "--batch-size", str(args.batch_size), "--anchors", str(anchors), "--warmup",
        str(max(1, steps_ // 20)), "--lr", str(args.lr), "--loss", args.loss, "--gamma", str(args.gamma), "--dtype",
        "bfloat16", *chunk]
    train = ["finetune", "--base", base, "--data", str(out / "train-data"), "--target", str(args.train_target),
             "--out", draft, *settings, *threads, "--force"]
    steps = [(f"finetune {fmt}", train),
             (f"eval {fmt}", ["eval", "--draft", draft, "--data", str(out / "heldout-data"), "--reference", base,
                              "--json", *threads]),
             (f"verify {fmt}", ["verify", draft, "--drop-in", base, "--target", target]),
             (f"card {fmt}", ["card", "render", draft, "--meta", str(CARD), "--eval", str(out / f"eval-{fmt}.log"),
                              "-o", str(out / f"card-{fmt}.md"), "--force"]),
             (f"card lint {fmt}", ["card", "lint", str(out / f"card-{fmt}.md"), "--checkpoint", draft,
                                   "--eval", str(out / f"eval-{fmt}.log")])]
    if fmt == "spec" and args.vllm_python:
        steps.append(("eval spec vllm", ["eval", "--draft", draft, "--target", target,
                                         "--prompts", str(out / "heldout.jsonl"), "--max-new-tokens",
                                         str(args.max_new_tokens), "--engine", "vllm", "--vllm-python",
                                         args.vllm_python, "--json", *threads]))
    return steps


def main() -> None:
    args = parse_args()
    if not (args.target / "config.json").is_file():
        sys.exit(f"real_recipe: {args.target} has no config.json; build the world: .ci/real-target.sh")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    first_lines(PROMPTS / "smollm2-train.jsonl", args.train, out / "train.jsonl")
    first_lines(PROMPTS / "smollm2-heldout.jsonl", args.heldout, out / "heldout.jsonl")
    threads = ["--threads", str(args.threads)] if args.threads else []
    name, command = init_k3_step(args, out)
    record = [run_step(name, CLI + command, out / "init-k3.log")]
    taps = ",".join(str(t) for t in json.loads((out / "k3-base" / "config.json").read_text())["target_layer_ids"])
    steps = rollout_steps(args, out, threads)
    if "spec" in args.formats:
        steps.append(init_spec_step(args, out, taps))
    for fmt in args.formats:
        steps += draft_steps(args, out, fmt, threads)
    for name, command in steps:
        record.append(run_step(name, CLI + command, out / f"{name.replace(' ', '-')}.log"))
    summary = summarize(args, out, record)
    (out / "recipe.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(summary)
    print(f"total {sum(s['seconds'] for s in record):.0f} s; wrote {out / 'recipe.json'}")


def summarize(args: argparse.Namespace, out: Path, record: list[dict[str, object]]) -> dict[str, object]:
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"}
    settings.pop("vllm_python", None)
    drafts = {FORMATS[fmt]: draft_summary(out, fmt) for fmt in args.formats}
    return {"settings": settings, "load_average": os.getloadavg(), "steps": record, "drafts": drafts}


def draft_summary(out: Path, fmt: str) -> dict[str, object]:
    result = json.loads((out / f"eval-{fmt}.log").read_text())
    summary: dict[str, object] = {
        "simulated": {"trained": _al(result), "untrained base": _al(result["reference"]),
                      "prompt lookup": _al(result["baseline"])},
        "by_dataset": {name: {"trained": _al(d), "untrained base": _al(d["reference"]) if d.get("reference") else None,
                              "prompt lookup": _al(d["baseline"]) if d.get("baseline") else None}
                       for name, d in result["by_dataset"].items()},
        "drafts": result["drafts"], "k": result["k"],
    }
    measured = out / f"eval-{fmt}-vllm.log"
    if measured.is_file():
        served = json.loads(measured.read_text())
        summary["vllm"] = {"trained": _al(served), "lossless": served.get("lossless"),
                           "measured_by": served.get("measured_by")}
    return summary


def print_summary(summary: dict[str, object]) -> None:
    for fmt, draft in summary["drafts"].items():  # type: ignore[attr-defined]
        for how in ("simulated", "vllm"):
            for name, stats in draft.get(how, {}).items():
                if isinstance(stats, dict) and "acceptance_length" in stats:
                    print(f"{fmt} {how} {name}: AL {stats['acceptance_length']:.3f}, "
                          f"per position {stats['per_position']}")


def _al(stats: dict[str, object]) -> dict[str, object]:
    per = stats["per_position"]
    return {"acceptance_length": round(float(stats["acceptance_length"]), 4),  # type: ignore[arg-type]
            "per_position": [round(float(a), 3) for a in per],  # type: ignore[union-attr]
            "drafts": stats.get("drafts")}


if __name__ == "__main__":
    main()
