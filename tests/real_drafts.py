"""CI-sized trained drafts on the SmolLM2 world, one per format, built once per test session.

`build_real_drafts(run)` runs, each as its own `dspark-hub` process, the real recipe's commands at CI size
(docs/real-model.md; `bench/real_recipe.py --ci` writes the same layout, with its own settings):

    init run/k3-base --target T --taps 1,7,14,22,29
    init run/spec-base --target T --format speculators --taps 1,7,14,22,29 --draft-vocab 8192 --vocab-from ...
    rollouts --draft-config run/k3-base/config.json --prompts run/train.jsonl --out run/train-data     (24 prompts)
    rollouts ... --prompts run/heldout.jsonl --out run/heldout-data                                  (8 prompts)
    finetune --base run/k3-base --data run/train-data --out run/k3-draft        (30 steps, 4 x 8 anchors)
    finetune --base run/spec-base --data run/train-data --out run/spec-draft    (150 steps, 8 x 32)

Both drafts tap the same layers, the last being the target's final layer (29), so one pair of rollouts
serves both and the final-norm mistake applies to both. `DSPARK_REAL_RUN=DIR` names a run folder already
built this way (every path below present): it is used as it is, nothing is trained.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "bench" / "prompts"
WORLD = Path(os.environ.get("DSPARK_WORLD_CACHE", Path.home() / ".cache" / "dspark-hub")) / "smollm2-135m-instruct"
WORLD_READY = (WORLD / ".dspark-hub-ready-1").is_file()
TARGET = WORLD / "f32"
#: The taps: the K3 recipe's spread, its last moved onto the final layer (29 of 30), where the norm matters.
TAPS = "1,7,14,22,29"
TRAIN_PROMPTS, HELDOUT_PROMPTS, NEW_TOKENS = 24, 8, 48
#: Each format's CI-sized finetune: the k3_dspark step scores the whole 49,152-token vocabulary (2.4 s at 4 x 8
#: anchors), the speculators one its pruned 8,192 (0.5 s at 8 sequences x 4 anchors, 32 a packed row), so the
#: speculators draft gets 150 steps.
FINETUNE = {"k3_dspark": ["--steps", "30", "--batch-size", "4", "--anchors", "8", "--warmup", "2", "--lr", "3e-3",
                          "--loss", '{"kl": 1}'],
            "speculators": ["--steps", "150", "--batch-size", "8", "--anchors", "4", "--warmup", "8", "--lr", "1e-3",
                            "--loss", '{"kl": 1}']}
#: Each format's (untrained base, trained draft) folder names inside a run.
FOLDERS = {"k3_dspark": ("k3-base", "k3-draft"), "speculators": ("spec-base", "spec-draft")}


@dataclass(frozen=True)
class RealDraft:
    """A trained draft, the held-out rollouts of its taps, the prompts they came from, and the target."""

    format: str
    draft: Path
    heldout_data: Path
    heldout_prompts: Path
    target: Path


def drafts_in(run: Path) -> dict[str, RealDraft]:
    return {fmt: RealDraft(fmt, run / trained, run / "heldout-data", run / "heldout.jsonl", TARGET)
            for fmt, (_, trained) in FOLDERS.items()}


def dspark_hub(*args: str) -> None:
    """One command in its own process, at one thread (`init` takes no `--threads`: it runs no model)."""
    threads = () if args[0] == "init" else ("--threads", "1")
    done = subprocess.run([sys.executable, "-m", "dspark_hub", *args, *threads, "-q"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, f"dspark-hub {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"


def _first_lines(src: Path, n: int, dst: Path) -> Path:
    lines = src.read_text(encoding="utf-8").splitlines()[:n]
    dst.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return dst


def build_real_drafts(run: Path) -> dict[str, RealDraft]:
    """Train one CI-sized draft per format into `run` (see the module docstring); the drafts by format."""
    run.mkdir(parents=True, exist_ok=True)
    train = _first_lines(PROMPTS / "smollm2-train.jsonl", TRAIN_PROMPTS, run / "train.jsonl")
    heldout = _first_lines(PROMPTS / "smollm2-heldout.jsonl", HELDOUT_PROMPTS, run / "heldout.jsonl")
    target = str(TARGET)
    init = ["init", "--target", target, "--taps", TAPS, "--force"]
    dspark_hub(*init, str(run / "k3-base"))
    dspark_hub(*init, str(run / "spec-base"), "--format", "speculators", "--draft-vocab", "8192",
                "--vocab-from", str(train))
    for prompts, out in ((train, "train-data"), (heldout, "heldout-data")):
        dspark_hub("rollouts", "--target", target, "--prompts", str(prompts), "--draft-config",
                    str(run / "k3-base" / "config.json"), "--out", str(run / out), "--max-new-tokens", str(NEW_TOKENS),
                    "--batch-size", "16", "--force")
    for fmt, (base, trained) in FOLDERS.items():
        dspark_hub("finetune", "--base", str(run / base), "--data", str(run / "train-data"), "--target", target,
                   "--out", str(run / trained), *FINETUNE[fmt], "--force")
    return drafts_in(run)


def real_drafts(tmp: Path) -> dict[str, RealDraft]:
    """The run `DSPARK_REAL_RUN` names when set, else a new one built under `tmp`."""
    given = os.environ.get("DSPARK_REAL_RUN")
    if given:
        drafts = drafts_in(Path(given))
        missing = [str(p) for d in drafts.values() for p in (d.draft, d.heldout_data, d.heldout_prompts)
                   if not p.exists()]
        assert not missing, f"DSPARK_REAL_RUN={given} lacks {missing}; build it with tests.real_drafts"
        return drafts
    return build_real_drafts(tmp)
