"""Speculators DSpark on SmolLM2: `dspark-hub finetune` against speculators 0.9.0's own training step.

Usage: python bench/real_speculators_quality.py [--ci] [--work DIR] [--keep]
       [--train-prompts N] [--new-tokens N] [--steps N] [--batch-size N] [--anchors N]
       [--eval-prompts N] [--eval-tokens N] [--draft-vocab N] [--no-vllm] [--json]
       python bench/real_speculators_quality.py --table-from WORK/result.json

On the SmolLM2-135M-Instruct world (`.ci/real-target.sh`, float32 folder; docs/real-model.md), one run:

1. `init --target T --format speculators` (a full-vocabulary draft whose config gives `rollouts` its taps),
   then `rollouts` of the first N train prompts (bench/prompts/smollm2-train.jsonl, transformers engine), then
   the untrained base: `init --target T --format speculators --draft-vocab V --vocab-from <rollouts>`;
2. the same base trained on the same rollouts twice, with the same batches (`trainer.batch_indices`),
   optimizer (AdamW, betas 0.9/0.95, no weight decay), schedule (warmup, cosine to 0.1), clipping (1.0),
   loss and anchors per row: once by `dspark-hub finetune`, once by the library's `DSparkDraftModel`
   forward + loss in the speculators 0.9.0 venv (bench/_speculators_library_train.py), saved with the
   library's `save_pretrained`;
3. `eval --engine vllm` (vLLM 0.32.0 CPU venv, float32) on the held-out prompts for base, ours and the
   library's, and the simulated `eval` of each (ours with `--reference` the library's, so both share
   rollouts); the simulated run also measures prompt lookup (n-gram) on the same continuations;
4. one table: trainer, steps, supervised tokens, acceptance length (vLLM and simulated), acceptance per
   position (vLLM), wall time of the training step (process included), with the date and load average.

`--ci` is the CI-sized run (tests/test_real_speculators_quality.py; vLLM measures the two trained drafts
only, each engine start costing about two minutes on a busy machine). With `--work DIR` the result is also
written to DIR/result.json (`--table-from` prints its table again). Exit 0 when everything ran, 1 when a
step failed (the tail of its stderr shown).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "prompts"
LOSS = '{"ce": 0.1, "tv": 0.9}'
FULL = {"train_prompts": 96, "new_tokens": 64, "steps": 60, "batch_size": 8, "anchors": 192, "lr": 1e-3,
        "warmup": 6, "eval_prompts": 40, "eval_tokens": 48, "draft_vocab": 8192}
CI = {"train_prompts": 24, "new_tokens": 32, "steps": 12, "batch_size": 4, "anchors": 64, "lr": 1e-3,
      "warmup": 2, "eval_prompts": 5, "eval_tokens": 24, "draft_vocab": 2048}


class StepFailed(Exception):
    pass


def run(args: list[str], *, env: dict | None = None, cwd: Path = ROOT) -> tuple[str, float]:
    """Run one command; its stdout and wall seconds, or StepFailed naming it with its stderr's tail."""
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise StepFailed(f"{' '.join(args[:4])} ... exited {done.returncode}:\n{tail}")
    return done.stdout, seconds


def cli(*args: str) -> tuple[str, float]:
    return run([sys.executable, "-m", "dspark_hub", *args])


def cli_json(*args: str) -> tuple[dict, float]:
    out, seconds = cli(*args, "--json")
    return json.loads(out), seconds


def helper_python(script: str) -> str:
    out, _ = run(["bash", str(ROOT / ".ci" / script)])
    return out.strip().splitlines()[-1]


def first_prompts(split: str, count: int, dst: Path) -> Path:
    lines = (PROMPTS / f"smollm2-{split}.jsonl").read_text(encoding="utf-8").splitlines()[:count]
    dst.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return dst


def finetune_tokens(folder: Path) -> tuple[int, int, float | None]:
    entries = [json.loads(line) for line in (folder / "training_log.jsonl").read_text().splitlines()]
    steps = [e for e in entries if "tokens" in e]
    return len(steps), sum(e["tokens"] for e in steps), steps[-1]["loss"] if steps else None


def summary(doc: dict) -> dict:
    return {"al": doc["acceptance_length"], "per_position": doc.get("per_position"),
            "accepted": doc.get("accepted_per_position"), "drafts": doc.get("drafts")}


def measure(settings: dict, work: Path, vllm: bool, vllm_base: bool = True) -> dict:
    target, _ = run(["bash", str(ROOT / ".ci" / "real-target.sh")])
    target = target.strip().splitlines()[-1]
    train = first_prompts("train", settings["train_prompts"], work / "train.jsonl")
    heldout = first_prompts("heldout", settings["eval_prompts"], work / "heldout.jsonl")
    times: dict[str, float] = {}
    _, times["init"] = cli("init", str(work / "full"), "--target", target, "--format", "speculators", "--quiet")
    _, times["rollouts"] = cli("rollouts", "--teacher", target, "--prompts", str(train), "--draft-config",
                               str(work / "full" / "config.json"), "--out", str(work / "rollouts"),
                               "--max-new-tokens", str(settings["new_tokens"]), "--batch-size", "16", "--quiet")
    cli("init", str(work / "base"), "--target", target, "--format", "speculators", "--draft-vocab",
        str(settings["draft_vocab"]), "--vocab-from", str(work / "rollouts"), "--quiet")
    common = {"steps": settings["steps"], "batch_size": settings["batch_size"], "lr": settings["lr"],
              "warmup": settings["warmup"], "min_lr_ratio": 0.1, "clip": 1.0, "max_anchors": settings["anchors"],
              "loss": LOSS, "gamma": 4.0, "seed": 0}
    _, ours_seconds = cli("finetune", "--base", str(work / "base"), "--data", str(work / "rollouts"), "--out",
                          str(work / "ours"), "--teacher", target, "--steps", str(common["steps"]), "--batch-size",
                          str(common["batch_size"]), "--lr", str(common["lr"]), "--warmup", str(common["warmup"]),
                          "--min-lr-ratio", "0.1", "--clip", "1.0", "--anchors", str(common["max_anchors"]),
                          "--loss", LOSS, "--gamma", "4.0", "--seed", "0", "--quiet")
    steps, tokens, loss = finetune_tokens(work / "ours")
    trainers = {"dspark-hub finetune": {"steps": steps, "tokens": tokens, "loss": loss, "seconds": ours_seconds,
                                        "draft": work / "ours"}}
    library_out, library_seconds = run(
        [helper_python("venv-speculators.sh"), str(ROOT / "bench" / "_speculators_library_train.py"),
         json.dumps({**common, "base": str(work / "base"), "data": str(work / "rollouts"),
                     "out": str(work / "library")})],
        cwd=Path(target).parent,    # the draft names its verifier relative to the target's parent (init --target)
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    library = json.loads(library_out.strip().splitlines()[-1])
    trainers["speculators 0.9.0 (library step)"] = {"steps": library["steps"], "tokens": library["tokens"],
                                                    "loss": library["last_loss"], "seconds": library_seconds,
                                                    "draft": work / "library"}
    trainers["untrained base"] = {"steps": 0, "tokens": 0, "loss": None, "seconds": None, "draft": work / "base"}
    evals = ["--teacher", target, "--prompts", str(heldout), "--max-new-tokens", str(settings["eval_tokens"]),
             "--quiet"]
    ours, library_name = trainers["dspark-hub finetune"], "speculators 0.9.0 (library step)"
    simulated, times["eval simulated (ours + library + n-gram)"] = cli_json(
        "eval", "--draft", str(ours["draft"]), "--reference", str(trainers[library_name]["draft"]), *evals)
    ours["simulated"] = summary(simulated)
    trainers[library_name]["simulated"] = summary(simulated["reference"])
    base_sim, times["eval simulated (base)"] = cli_json("eval", "--draft", str(work / "base"), *evals)
    trainers["untrained base"]["simulated"] = summary(base_sim)
    ngram = {"simulated": summary(simulated["baseline"]), "steps": None, "tokens": None, "loss": None,
             "seconds": None}
    if vllm:
        python = helper_python("venv-vllm.sh")
        for name in ("dspark-hub finetune", library_name, *(["untrained base"] if vllm_base else [])):
            doc, times[f"eval vllm ({name})"] = cli_json("eval", "--engine", "vllm", "--vllm-python", python,
                                                         "--draft", str(trainers[name]["draft"]), *evals)
            trainers[name]["vllm"] = {**summary(doc), "lossless": doc["lossless"]}
    trainers["prompt lookup (n-gram)"] = ngram
    return {"settings": settings, "target": target, "trainers": trainers, "times": times,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "load": os.getloadavg()}


def _al(entry: dict | None) -> str:
    return "-" if not entry else f"{entry['al']:.3f}"


def _positions(entry: dict | None) -> str:
    if not entry or not entry.get("per_position"):
        return "-"
    return " ".join(f"{p:.2f}" for p in entry["per_position"])


def table(result: dict) -> str:
    head = ("| trainer | steps | supervised tokens | AL vLLM | AL simulated | accepted per position (vLLM, "
            "else simulated) | train wall s |\n|---|---|---|---|---|---|---|\n")
    rows = []
    for name, t in result["trainers"].items():
        vllm, sim = t.get("vllm"), t.get("simulated")
        seconds = "-" if t["seconds"] is None else f"{t['seconds']:.0f}"
        rows.append(f"| {name} | {'-' if t['steps'] is None else t['steps']} | "
                    f"{'-' if t['tokens'] is None else t['tokens']} | {_al(vllm)} | {_al(sim)} | "
                    f"{_positions(vllm or sim)} | {seconds} |")
    return head + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ci", action="store_true", help="the CI-sized run")
    parser.add_argument("--work", type=Path, help="work folder (default: a temp folder, removed unless --keep)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-vllm", dest="vllm", action="store_false")
    parser.add_argument("--table-from", dest="table_from", type=Path, metavar="RESULT_JSON",
                        help="print the table of an earlier run's WORK/result.json instead of running")
    parser.add_argument("--json", dest="as_json", action="store_true")
    for key in FULL:
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(FULL[key]))
    args = parser.parse_args(argv)
    if args.table_from is not None:
        report(json.loads(args.table_from.read_text(encoding="utf-8")))
        return 0
    settings = dict(CI if args.ci else FULL)
    settings.update({k: getattr(args, k) for k in FULL if getattr(args, k) is not None})
    work = args.work or Path(tempfile.mkdtemp(prefix="spec-quality-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        result = measure(settings, work, args.vllm, vllm_base=not args.ci)
    except StepFailed as failure:
        print(f"real_speculators_quality: {failure}", file=sys.stderr)
        return 1
    finally:
        if args.work is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    result["wall_seconds"] = time.perf_counter() - started
    if args.work is not None:
        (work / "result.json").write_text(json.dumps(result, default=str, indent=2) + "\n", encoding="utf-8")
    if args.as_json:
        print(json.dumps(result, default=str, indent=2))
        return 0
    report(result)
    return 0


def report(result: dict) -> None:
    print(table(result))
    load = " ".join(f"{v:.1f}" for v in result["load"])
    print(f"{result['date']}, load average {load}, whole run {result['wall_seconds']:.0f} s; settings "
          f"{json.dumps(result['settings'])}; step wall times (s): "
          + ", ".join(f"{k} {v:.0f}" for k, v in result["times"].items()))


if __name__ == "__main__":
    sys.exit(main())
