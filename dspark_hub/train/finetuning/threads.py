"""How many CPU threads `rollouts`, `finetune` and `eval` give torch, and why.

torch's default is one intra-op thread per core. On a machine other processes keep busy that is
the slowest choice: the threads of one op wait for each other while they share cores with the
other load. Measured on the shared 2-core machine (bench/bench_threads.py, docs/real-model.md):
at load average 10-12 a tiny-profile `finetune` step with 2 threads ran at less than half the speed
of 1 thread, and `rollouts` was slower too. So the default is the number of cores nobody else is
using, plus one for us: `min(cores, 1 + idle)` with `idle = cores - load average` (1 minute,
rounded down, never negative). An idle machine gets every core, a loaded one a single thread.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from dspark_hub.documents import Document
from dspark_hub.errors import UsageError


@dataclass(frozen=True)
class ThreadChoice(Document):
    """The thread count and where it came from."""

    threads: int
    cores: int
    load: float | None     # the 1-minute load average when the default decided
    source: str            # "requested", "environment" (OMP_NUM_THREADS) or "default"

    @property
    def reason(self) -> str:
        if self.source == "requested":
            return "as requested"
        if self.source == "environment":
            return "from OMP_NUM_THREADS"
        if self.load is None:
            return f"{self.cores} cores, load average unknown"
        return f"{self.cores} cores at load average {self.load:.1f}"


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not on Linux
        return os.cpu_count() or 1


def default_threads(cores: int, load: float | None) -> int:
    """`min(cores, 1 + idle cores)`: every core when idle, one when other work fills the machine."""
    if load is None:
        return cores
    idle = max(0, cores - math.ceil(load - 0.5))
    return max(1, min(cores, 1 + idle))


def choose_threads(requested: int | None = None) -> ThreadChoice:
    """The thread count to use: `requested`, else a positive `OMP_NUM_THREADS`, else `default_threads` of this
    machine now.

    Raises:
        UsageError: `requested` is not a positive number.
    """
    cores = usable_cores()
    if requested is not None:
        if requested < 1:
            raise UsageError(f"{requested} threads: give at least 1", param="threads")
        return ThreadChoice(requested, cores, None, "requested")
    environment = os.environ.get("OMP_NUM_THREADS", "")
    if environment.isdigit() and int(environment) > 0:
        return ThreadChoice(int(environment), cores, None, "environment")
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return ThreadChoice(default_threads(cores, load), cores, load, "default")


def apply_threads(choice: ThreadChoice) -> None:
    """Give torch `choice.threads` intra-op threads, and processes started from here (a vLLM engine) the same."""
    import torch

    torch.set_num_threads(choice.threads)
    os.environ["OMP_NUM_THREADS"] = str(choice.threads)
