"""Two ways of doing the same work, timed alternately in one process (the in-process benches' loop).

Each round runs both ways, the order flipped every round so neither always runs on a warm cache,
prints the two times, their ratio (old / new) and whether the results are the same, and the last line
gives the median ratio with its range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MIN_RUNS = 5
#: The SmolLM2 world `.ci/real-target.sh` builds: the real-model benches' default target.
WORLD = Path(os.environ.get("DSPARK_WORLD_CACHE", Path.home() / ".cache" / "dspark-hub")) / "smollm2-135m-instruct"


def parse_rounds(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """`parser` with `--runs` added, parsed; fewer than MIN_RUNS rounds is a usage error."""
    parser.add_argument("--runs", type=int, default=MIN_RUNS, help=f"alternating rounds (at least {MIN_RUNS})")
    args = parser.parse_args()
    if args.runs < MIN_RUNS:
        parser.error(f"--runs: at least {MIN_RUNS}, so one disturbed round cannot decide the median")
    return args


def alternate(old: tuple[str, Callable[[], Any]], new: tuple[str, Callable[[], Any]], runs: int,
              same: Callable[[Any, Any], bool]) -> list[float]:
    """Time `old` and `new` alternately for `runs` rounds; print each round and the median; the ratios."""
    ratios = []
    for round_ in range(runs):
        seconds, made = {}, {}
        for name, way in (old, new)[:: 1 if round_ % 2 == 0 else -1]:
            start = time.perf_counter()
            made[name] = way()
            seconds[name] = time.perf_counter() - start
        ratios.append(seconds[old[0]] / seconds[new[0]])
        print(f"round {round_ + 1}: {old[0]} {seconds[old[0]]:.1f} s, {new[0]} {seconds[new[0]]:.1f} s, "
              f"ratio {ratios[-1]:.2f}, same results: {same(made[old[0]], made[new[0]])}", flush=True)
    print(f"median ratio {old[0]} / {new[0]} over {runs} rounds: {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}); load average {os.getloadavg()[0]:.1f}")
    return ratios
