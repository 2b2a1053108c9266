"""How `finetune` keeps a long run out of the kernel and its memory flat: two process settings.

A training step allocates and frees the same working set every step, in shapes that change with
every batch (the packed row's length, each sequence's attention span). Two defaults of the
process turn that into kernel time and climbing memory (measured on the SmolLM2 recipe,
docs/training.md#long-runs-kernel-time-and-memory):

- **glibc's malloc** serves every block above its mmap threshold (128 KiB, raised on the fly to at
  most 32 MiB) with a fresh `mmap` and unmaps it on `free`, and gives the heap's free top back
  past its trim threshold. So every step the kernel maps, faults in and zero-fills its working set
  again: a fifth to a half of the process's CPU time was system time. `mallopt` sets the mmap
  threshold to 1 GiB and turns trimming off, so freed blocks stay in the heap for the next step.
- **oneDNN** (bf16 matmuls on CPUs with AVX512-BF16 or AMX) compiles a kernel for each new shape
  and keeps up to 1,024 in its primitive cache and 1,024 more in PyTorch's ideep cache. Shapes that
  change every step fill both with kernels that never run again (about 0.5 GB for the speculators
  recipe), and their churn fragments the heap, so peak memory climbed all run. Capping each cache
  at `ONEDNN_CACHE` entries bounds that; the shapes every step uses stay cached.

`steady_allocator()` applies both to this process (the CLI calls it before `finetune` starts).
Settings the user made win: a `MALLOC_*_` variable or a `glibc.malloc` tunable keeps glibc's
part off, a cache capacity in the environment is kept, and `DSPARK_ALLOCATOR=system` keeps every
default (the benchmark's "before"). Setting malloc in-process (rather than re-executing with
`MALLOC_` variables) keeps the process id, costs no second start-up and does not reach the
processes the run starts (a vLLM engine); the two cache capacities are environment variables,
which they inherit (a cap, harmless there). Where the C library is not glibc, its part does
nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass

from dspark_hub.documents import Document

#: glibc's `<malloc.h>` parameters.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: Blocks below this come from the heap and go back to it (mallopt takes an int: at most 2 GiB).
MMAP_THRESHOLD = 1 << 30
#: Entries each oneDNN cache keeps (the primitive cache and PyTorch's ideep cache; each defaults to 1,024).
ONEDNN_CACHE = 256
#: The environment variables each oneDNN cache reads its capacity from (the first one set wins).
ONEDNN_CACHE_VARIABLES = (("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY"),
                          ("LRU_CACHE_CAPACITY",))
#: `DSPARK_ALLOCATOR=system` keeps every default.
SWITCH = "DSPARK_ALLOCATOR"


@dataclass(frozen=True)
class AllocatorChoice(Document):
    """What `steady_allocator` set, and why not where it did not."""

    malloc: str          # "set", or why not: "environment", "system", "not glibc", "refused"
    onednn: str          # "set", "environment" or "system"


def malloc_configured(environ: dict[str, str] | os._Environ[str]) -> bool:
    """The user chose glibc's malloc settings already (`MALLOC_*_` variables or a `glibc.malloc` tunable)."""
    return (any(name.startswith("MALLOC_") and name.endswith("_") for name in environ)
            or "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""))


def hold_freed_memory() -> str:
    """glibc: freed blocks below `MMAP_THRESHOLD` stay in the heap, which is never trimmed; "set" or why not."""
    if platform.libc_ver()[0] != "glibc":
        return "not glibc"
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return "not glibc"
    # M_TRIM_THRESHOLD -1: never trim (glibc reads it as the largest size_t)
    set_both = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, -1) == 1
    return "set" if set_both else "refused"


def cap_onednn_caches(environ: dict[str, str] | os._Environ[str]) -> str:
    """Each oneDNN cache's capacity to `ONEDNN_CACHE`, unless the environment names one; "set" or "environment".

    oneDNN reads these when it first builds a kernel, so this must run before any bf16 matmul.
    """
    chosen = "set"
    for names in ONEDNN_CACHE_VARIABLES:
        if any(name in environ for name in names):
            chosen = "environment"
            continue
        environ[names[0]] = str(ONEDNN_CACHE)
    return chosen


def steady_allocator(environ: dict[str, str] | os._Environ[str] | None = None) -> AllocatorChoice:
    """Apply both settings to this process (see the module docstring), leaving what the user set."""
    environ = os.environ if environ is None else environ
    if environ.get(SWITCH, "") == "system":
        return AllocatorChoice("system", "system")
    malloc = "environment" if malloc_configured(environ) else hold_freed_memory()
    return AllocatorChoice(malloc, cap_onednn_caches(environ))
