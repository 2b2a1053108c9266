"""The benchmarks' own arithmetic: what they report is what their docstrings promise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_bench_deep_reports_the_median_of_alternating_rounds(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_deep

    # one round disturbed by another process must not decide the verdict (the best run would: 0.5)
    deep, alone = [10.0, 5.0, 5.5, 5.2, 6.0], [5.0, 10.0, 5.0, 5.0, 5.0]
    assert bench_deep.round_ratios(deep, alone) == pytest.approx((1.1, 0.5, 2.0))
    assert bench_deep.MIN_REPEAT >= 5


def test_bench_deep_refuses_fewer_than_five_rounds(tmp_path):
    run = subprocess.run([sys.executable, str(BENCH / "bench_deep.py"), str(tmp_path), "--repeat", "3"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "at least 5" in run.stderr
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.slow
def test_gpu_smoke_passes_on_the_cpu_it_falls_back_to():
    """The day a GPU is here the script must run: its CPU path shares the world, the runs and the comparison."""
    run = subprocess.run([sys.executable, str(BENCH / "gpu_smoke.py"), "--device", "cpu"], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "gpu_smoke: PASS (2 of 2 sharded runs match the CPU reference)" in run.stdout


@pytest.mark.slow
def test_bench_train_builds_a_world_finetune_accepts(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_train

    assert bench_train.throughput(1) > 0
    assert "finetune, tiny config: 1 steps" in capsys.readouterr().out


def test_gpu_smoke_eval_vllm_without_a_gpu_exits_77_in_one_line():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(BENCH / "gpu_smoke_eval_vllm.py")], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 77, done.stderr
    (line,) = done.stdout.strip().splitlines()
    assert line.startswith("no CUDA GPU here") and "--no-engine" in line and done.stderr == ""


def test_bench_eval_lockstep_refuses_fewer_than_five_rounds(tmp_path):
    run = subprocess.run([sys.executable, str(BENCH / "bench_eval_lockstep.py"), str(tmp_path), str(tmp_path),
                          "--runs", "4"], capture_output=True, text=True)
    assert run.returncode == 2 and "--runs: at least 5" in run.stderr


def test_bench_long_finetune_refuses_fewer_than_five_rounds_before_building_anything(tmp_path):
    run = subprocess.run([sys.executable, str(BENCH / "bench_long_finetune.py"), str(tmp_path / "work"),
                          "--runs", "4"], capture_output=True, text=True)
    assert run.returncode == 2 and "at least 5" in run.stderr
    assert not (tmp_path / "work").exists()


def test_bench_long_finetune_runs_the_recipes_finetune_before_and_after(monkeypatch, tmp_path):
    """Both ways run the recipe's own command; "before" only switches the allocator settings off."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_long_finetune as bench

    args = bench.parse_args([str(tmp_path), "--spec-steps", "300", "--k3-steps", "100"])
    spec, k3 = (bench.finetune_command(args, fmt, tmp_path / "out") for fmt in ("spec", "k3"))
    for command, steps in ((spec, "300"), (k3, "100")):
        assert command[command.index("--steps") + 1] == steps and command[command.index("--out") + 1] == str(
            tmp_path / "out")
        for flag, value in (("--batch-size", "8"), ("--loss", '{"kl": 1}'), ("--gamma", "2.0"), ("--dtype", "bfloat16"),
                            ("--lr", "0.003")):
            assert command[command.index(flag) + 1] == value, flag
    # --anchors is per sequence: 16 for each k3_dspark sequence; 16 over the speculators draft's packed row of 8
    assert (k3[k3.index("--anchors") + 1], spec[spec.index("--anchors") + 1]) == ("16", "2")
    assert "--loss-chunk" in k3 and "--loss-chunk" not in spec
    assert bench.WAYS == {"before": {"DSPARK_ALLOCATOR": "system"}, "after": {}}
