"""`finetune`'s process settings (`train/finetuning/allocator.py`): freed memory stays in the heap, oneDNN's caches
are capped, and whatever the user set wins.

The malloc setting changes the whole process, so its effect is measured in processes of their own: a block
allocated and freed over and over faults its pages in again every time under glibc's defaults, and once
under the setting (`ru_minflt`, the kernel's count of minor page faults).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
from click.testing import CliRunner

import dspark_hub.cli.train
import dspark_hub.train
from dspark_hub.cli.main import cli
from dspark_hub.train.finetuning import allocator
from dspark_hub.train.finetuning.allocator import ONEDNN_CACHE, cap_onednn_caches, steady_allocator

#: 64 MiB allocated and freed 5 times: 16,384 pages a time, above glibc's largest automatic mmap threshold.
REFAULTS = r'''
import resource, sys
if sys.argv[1] == "steady":
    from dspark_hub.train.finetuning.allocator import steady_allocator
    print(steady_allocator().malloc)
else:
    print("defaults")
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
bytearray(64 << 20)
before = faults()
for _ in range(5):
    bytearray(64 << 20)
print(faults() - before)
'''

needs_glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the malloc setting is glibc's")


def _refaults(mode: str, **env: str) -> tuple[str, int]:
    environ = {k: v for k, v in os.environ.items() if k != "DSPARK_ALLOCATOR" and not k.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", REFAULTS, mode], capture_output=True, text=True, check=True,
                          env={**environ, **env})
    said, faults = done.stdout.split()
    return said, int(faults)


@needs_glibc
def test_freed_blocks_stay_in_the_heap_so_the_next_step_does_not_fault_them_in_again():
    said, faults = _refaults("steady")
    assert said == "set" and faults < 1_000, faults
    said, faults = _refaults("defaults")                    # glibc's own: unmapped on free, faulted in again
    assert said == "defaults" and faults > 5 * 16_384 * 0.9, faults


@needs_glibc
@pytest.mark.parametrize("env", [{"DSPARK_ALLOCATOR": "system"}, {"MALLOC_MMAP_THRESHOLD_": "131072"},
                                 {"MALLOC_TRIM_THRESHOLD_": "131072"}])
def test_a_process_where_the_user_chose_keeps_glibcs_behaviour(env):
    said, faults = _refaults("steady", **env)
    assert said in ("system", "environment") and faults > 16_384, (said, faults)


@pytest.fixture
def held(monkeypatch):
    """`hold_freed_memory` recorded instead of run: this test process keeps glibc's defaults."""
    calls: list[int] = []
    monkeypatch.setattr(allocator, "hold_freed_memory", lambda: calls.append(1) or "set")
    return calls


@pytest.mark.parametrize("env, malloc", [
    ({}, "set"),
    ({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512"}, "set"),          # a tunable, not malloc's
    ({"MALLOC_ARENA_MAX": "2"}, "set"),                                       # not a MALLOC_*_ setting
    ({"MALLOC_TRIM_THRESHOLD_": "0"}, "environment"),
    ({"MALLOC_MMAP_THRESHOLD_": "65536"}, "environment"),
    ({"MALLOC_TOP_PAD_": "0"}, "environment"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "environment"),
    ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0:glibc.malloc.mmap_threshold=1"}, "environment"),
])
def test_malloc_settings_in_the_environment_win(held, env, malloc):
    assert steady_allocator(dict(env)).malloc == malloc
    assert held == ([1] if malloc == "set" else [])


def test_oneDNNs_caches_are_capped_unless_the_environment_names_a_capacity(held):
    environ: dict[str, str] = {}
    assert cap_onednn_caches(environ) == "set"
    assert environ == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(ONEDNN_CACHE), "LRU_CACHE_CAPACITY": str(ONEDNN_CACHE)}
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        environ = {name: "1024"}
        assert cap_onednn_caches(environ) == "environment"
        assert environ[name] == "1024"                     # the user's capacity is kept


def test_dspark_allocator_system_keeps_every_default(held):
    environ = {"DSPARK_ALLOCATOR": "system"}
    assert steady_allocator(environ).to_dict() == {"malloc": "system", "onednn": "system"}
    assert environ == {"DSPARK_ALLOCATOR": "system"} and held == []


def test_finetune_applies_the_settings_before_the_run_and_rollouts_does_not(held, monkeypatch):
    """In this process (`hold_freed_memory` recorded), so the oneDNN variables are what shows it."""
    seen: dict[str, str | None] = {}

    def record(*args, **kwargs):
        seen["capacity"] = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
        raise SystemExit(0)

    monkeypatch.setattr(dspark_hub.train, "finetune", record)
    monkeypatch.setattr(dspark_hub.cli.train, "make_rollouts", record)
    for name in ("DSPARK_ALLOCATOR", "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)
    CliRunner().invoke(cli, ["rollouts", "--target", "t", "--prompts", "p", "--draft-config", "c", "--out", "o"])
    assert seen == {"capacity": None} and held == []
    CliRunner().invoke(cli, ["finetune", "--base", "b", "--out", "o"])
    assert seen == {"capacity": str(ONEDNN_CACHE)} and held == [1]
