"""CI-sized trained drafts on the SmolLM2 world, one per format, built once per test session by the real recipe.

`build_real_drafts(run)` runs `bench/real_recipe.py RUN --ci --threads 1` (docs/real-model.md): every step a
`dspark-hub` process, the float32 target, both drafts tapping 1,7,14,22,29 (the last the target's final layer,
so the final-norm mistake applies to both), one pair of rollouts for both, each format's finetune as the
recipe's `CI_FINETUNE` sets it, then eval, verify and card of each. The real-model tests share this one build:
tests/test_real_world.py checks the recipe's record (`recipe.json`), tests/test_real_mistakes.py and
tests/test_real_speculators_quality.py measure the drafts. `DSPARK_REAL_RUN=DIR` names a run folder already
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


def build_real_drafts(run: Path) -> dict[str, RealDraft]:
    """The CI-sized real recipe into `run` (see the module docstring); the drafts by format."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "real_recipe.py"), str(run), "--ci", "--threads", "1"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"bench/real_recipe.py --ci: exit {done.returncode}\n{done.stdout[-3000:]}"
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
