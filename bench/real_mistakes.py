"""What each convention mistake costs a trained draft, measured by `dspark-hub eval` (docs/convention-mistakes.md).

Usage:
    python bench/real_mistakes.py DRAFT --data HELDOUT --prompts HELDOUT.jsonl --work W [--target T] [--threads N]
                                  [--force]

DRAFT is a trained k3_dspark or speculators DSpark folder, HELDOUT the rollouts of the held-out prompts
captured with DRAFT's taps (`dspark-hub rollouts --draft-config DRAFT/config.json`), HELDOUT.jsonl the
prompts they were rolled out from (checked against the rollouts' digest). Each mistake that applies to
the draft is written as an artifact into W (`bench/_mistakes.py`: a draft-folder copy with one key or
tensor changed, or a held-out rollouts copy); a draft with shifted taps gets held-out rollouts of its own
taps (`dspark-hub rollouts`, the same prompts and settings: the same greedy paths). Then `dspark-hub eval`
(simulated, vLLM's verify loop, each its own process) measures the trained draft and every mutant on
the same paths. Beside eval's greedy counts, the script computes in-process the low-noise paired measure
the regression test uses (`_mistakes.expected_accepted`: expected accepted drafts per held-out anchor,
teacher-forced) and its paired z against the trained draft. It prints a table (AL, per-position
acceptance, change against the trained draft, the paired measure) and writes W/mistakes.json. TARGET
defaults to the rollouts' target.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _mistakes import Mistake, expected_accepted, mistakes_for, paired_z, target_layers  # noqa: E402

from dspark_hub.format.digests import sha256_file  # noqa: E402
from dspark_hub.train.data.rollouts import MANIFEST  # noqa: E402

CLI = [sys.executable, "-m", "dspark_hub"]
TRAINED = "trained"


def run(args: list[str], log: Path) -> float:
    """One `dspark-hub` command in its own process, stdout to `log` (stderr beside it); its wall seconds."""
    start = time.perf_counter()
    with log.open("w") as out, log.with_suffix(".err").open("w") as err:
        code = subprocess.run(CLI + args, stdout=out, stderr=err, cwd=ROOT).returncode
    if code != 0:
        sys.exit(f"real_mistakes: dspark-hub {args[0]} exited {code}; see {log.with_suffix('.err')}")
    return time.perf_counter() - start


def recapture(manifest: dict[str, Any], target: str, prompts: Path, config: Path, out: Path,
              threads: list[str], log: Path) -> float:
    """Held-out rollouts of the same prompts and settings for another draft config (its own taps)."""
    settings = manifest["settings"]
    eos = ["--ignore-eos"] if settings.get("ignore_eos") else []
    return run(["rollouts", "--target", target, "--prompts", str(prompts), "--draft-config", str(config),
                "--out", str(out), "--max-new-tokens", str(settings["max_new_tokens"]), "--batch-size", "16",
                *eos, *threads, "--force", "-q"], log)


def measure(draft: Path, data: Path, target: str, threads: list[str], log: Path) -> dict[str, Any]:
    """`dspark-hub eval --json` of one draft on one rollouts folder: the counts and the wall time."""
    seconds = run(["eval", "--draft", str(draft), "--data", str(data), "--target", target, "--json", *threads], log)
    doc = json.loads(log.read_text())
    keys = ("acceptance_length", "per_position", "accepted_per_position", "drafts", "k")
    return {**{key: doc[key] for key in keys}, "eval_seconds": round(seconds, 1), "draft": str(draft),
            "data": str(data)}


def write_artifacts(mistakes: list[Mistake], draft: Path, data: Path, work: Path) -> dict[str, tuple[Path, Path]]:
    """Each applicable mistake's (draft, data) pair, its artifact written into `work`."""
    pairs: dict[str, tuple[Path, Path]] = {}
    for mistake in mistakes:
        if not mistake.applicable:
            continue
        assert mistake.write is not None
        out = work / mistake.key
        if mistake.mutates == "data":
            mistake.write(data, out)
            pairs[mistake.key] = (draft, out)
        else:
            mistake.write(draft, out)
            pairs[mistake.key] = (out, data)
    return pairs


def add_paired_measure(rows: dict[str, dict[str, Any]], target: str) -> None:
    """Each row's mean expected accepted drafts per anchor (`_mistakes.expected_accepted`) and its paired z
    against the trained draft's, on the same anchors of the same paths."""
    import torch

    torch.set_num_threads(1)
    per_anchor = {key: expected_accepted(Path(row["draft"]), Path(row["data"]), Path(target))
                  for key, row in rows.items()}
    for key, row in rows.items():
        row["expected_accepted"] = round(float(per_anchor[key].mean()), 5)
        row["anchors"] = len(per_anchor[key])
        row["paired_z"] = None if key == TRAINED else round(paired_z(per_anchor[TRAINED], per_anchor[key]), 2)


def table(rows: dict[str, dict[str, Any]], titles: dict[str, str]) -> str:
    trained = rows[TRAINED]["acceptance_length"]
    lines = ["| mistake | AL | per-position acceptance (1..k) | AL change vs trained | slot-1 accepted / drafts "
             "| expected accepted per anchor (paired z vs trained) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for key, row in rows.items():
        al = row["acceptance_length"]
        change = "-" if key == TRAINED else f"{al - trained:+.3f}" + (
            f" ({(al - trained) / (trained - 1) * 100:+.0f}% of the gain over 1)" if trained > 1 else "")
        per = " ".join(f"{a:.3f}" for a in row["per_position"])
        z = "" if row["paired_z"] is None else f" (z {row['paired_z']:+.1f})"
        lines.append(f"| {titles.get(key, key)} | {al:.3f} | {per} | {change} | "
                     f"{row['accepted_per_position'][0]} / {row['drafts']} | {row['expected_accepted']:.4f}{z} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draft", type=Path)
    parser.add_argument("--data", type=Path, required=True, help="held-out rollouts with the draft's taps")
    parser.add_argument("--prompts", type=Path, required=True, help="the prompts the held-out rollouts came from")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--target", help="default: the rollouts' target")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--force", action="store_true", help="replace the work folder")
    args = parser.parse_args()
    manifest = json.loads((args.data / MANIFEST).read_text())
    if sha256_file(args.prompts) != manifest["settings"]["prompts_sha256"]:
        sys.exit(f"real_mistakes: {args.prompts} is not the prompts file {args.data} was rolled out from "
                 "(its SHA-256 differs from the manifest's prompts_sha256)")
    target = args.target or manifest["settings"]["teacher"]
    if args.work.exists():
        if not args.force:
            sys.exit(f"real_mistakes: {args.work} exists; pass --force to replace it")
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    threads = ["--threads", str(args.threads)] if args.threads else []
    mistakes = mistakes_for(args.draft, target_layers(Path(target)))
    pairs = write_artifacts(mistakes, args.draft, args.data, args.work)
    recaptured = {}
    if "taps_shifted" in pairs:
        shifted = pairs["taps_shifted"][0]
        data = args.work / "heldout-taps_shifted"
        recaptured["taps_shifted"] = round(recapture(manifest, target, args.prompts, shifted / "config.json", data,
                                                     threads, args.work / "rollouts-taps_shifted.log"), 1)
        pairs["taps_shifted"] = (shifted, data)
    rows = {TRAINED: measure(args.draft, args.data, target, threads, args.work / "eval-trained.log")}
    for key, (draft, data) in pairs.items():
        rows[key] = measure(draft, data, target, threads, args.work / f"eval-{key}.log")
        print(f"{key}: AL {rows[key]['acceptance_length']:.3f} ({rows[key]['eval_seconds']} s)", flush=True)
    add_paired_measure(rows, target)
    titles = {m.key: m.title for m in mistakes}
    print(table(rows, titles))
    for m in mistakes:
        print(f"- {m.title}: {m.change if m.applicable else 'not applicable: ' + str(m.reason_not_applicable)}")
    doc = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
           "command": " ".join([Path(sys.executable).name, *sys.argv]), "draft": str(args.draft),
           "data": str(args.data), "target": target, "rows": rows, "recapture_seconds": recaptured,
           "mistakes": [{"key": m.key, "title": m.title, "mutates": m.mutates, "change": m.change,
                         "not_applicable": m.reason_not_applicable} for m in mistakes]}
    (args.work / "mistakes.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.work / 'mistakes.json'}")


if __name__ == "__main__":
    main()
