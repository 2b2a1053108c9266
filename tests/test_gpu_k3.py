"""bench/gpu_k3.py, the Kimi-K3-scale GPU check: its CPU mode end to end (every phase's code but CUDA's, at
the tiny profile, with a simulated out-of-memory error for the anchor search), and its judgement on
failing and passing results, so that the one run it gets on a GPU is not its first."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs_text import read

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPT = BENCH / "gpu_k3.py"


def bench_module(monkeypatch, name: str):
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module(name)


@pytest.fixture
def k3(monkeypatch):
    return bench_module(monkeypatch, "gpu_k3")


@pytest.fixture
def phases(monkeypatch):
    """What runs in each phase's process (the anchor search)."""
    return bench_module(monkeypatch, "_gpu_k3_phases")


# ----------------------------------------------------------------------------- the script, end to end


@pytest.mark.slow
def test_cpu_mode_runs_every_phase_and_passes(tmp_path):
    """World, forward check, plain and FSDP2 training (torchrun, gloo), the weights gathered, the anchor search
    through simulated out-of-memory errors in backward (FSDP2 reset after each): the GPU run's code paths."""
    summary_path = tmp_path / "summary.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--phases", "forward,plain,fsdp",
                          "--simulate-oom", "backward:40", "--json", str(summary_path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["ok"] and summary["not_run"] == []
    assert [c["ok"] for c in summary["checks"]] == [True] * 13
    for label in ("plain", "fsdp"):
        config = summary["configurations"][label]
        assert config["steps"] == 6 and config["largest_anchors"] == 40 and config["smallest_failing_anchors"] == 42
        assert [p[1] for p in config["probes"]] == [True, False, False, True, False, False]
    assert summary["configurations"]["fsdp"]["world_size"] == 1
    assert "gpu_k3: PASS (13 of 13 checks passed)" in run.stdout
    assert "| FSDP2 (torchrun, world size 1) | 6 |" in run.stdout


def test_a_budget_too_small_runs_nothing_and_fails(tmp_path):
    run = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--budget-s", "1",
                          "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(r"^NOT RUN phase world: not run \(budget: [01] s left, the phase needs about 8 s\)$", run.stdout,
                     re.MULTILINE)
    assert "NOT RUN phase plain: not run (no world: the world phase did not finish)" in run.stdout
    assert "gpu_k3: FAIL" in run.stdout and not (tmp_path / "world").exists()


@pytest.mark.slow
def test_without_a_gpu_it_exits_77_in_one_line():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 77, run.stderr
    (line,) = run.stdout.strip().splitlines()
    assert line.startswith("gpu_k3: no GPU") and "--device cpu --small" in line


@pytest.mark.parametrize("argv, words", [
    (["--phases", "world,train"], "--phases: train"),
    (["--phases", ","], "--phases: none given"),
    (["--simulate-oom", "sideways:3"], "--simulate-oom: 'sideways:3'"),
    (["--simulate-oom", "forward:many"], "--simulate-oom: 'forward:many'"),
    (["--device", "cpu"], "the full size needs a GPU"),
])
def test_usage_errors_exit_2_naming_the_option(k3, capsys, argv, words):
    with pytest.raises(SystemExit) as exited:
        k3.parse_args(argv)
    assert exited.value.code == 2 and words in capsys.readouterr().err


def test_the_world_phase_is_added_to_the_phases_that_need_it(k3):
    assert k3.parse_args(["--phases", "fsdp", "--device", "cpu", "--small"]).phases == ("world", "fsdp")
    assert k3.parse_args(["--phases", "smoke"]).phases == ("smoke",)


# ----------------------------------------------------------------------------- the budget and the children


def test_a_child_past_its_time_is_ended_with_what_it_printed(k3):
    code, stopped, _, tail = k3.run_child([sys.executable, "-c", "import time; print('started', flush=True); "
                                           "time.sleep(120)"], timeout=3, env=os.environ, echo=lambda line: None)
    assert stopped and code is not None and code != 0 and tail == ["started"]


def test_a_child_that_fails_reports_its_exit_code(k3):
    code, stopped, _, tail = k3.run_child([sys.executable, "-c", "print('bad input'); raise SystemExit(3)"],
                                          timeout=60, env=os.environ, echo=lambda line: None)
    assert (code, stopped, tail) == (3, False, ["bad input"])


def test_no_phase_starts_without_the_time_it_needs(k3, tmp_path):
    options = k3.parse_args(["--device", "cpu", "--small"])
    lines: list[str] = []
    outcomes = k3.run_phases(options, k3.SMALL, tmp_path, k3.Budget(0.0), echo=lines.append)
    assert {o.status for o in outcomes.values()} == {"not run"}
    assert outcomes["smoke"].detail.startswith("budget: 0 s left")
    assert outcomes["fsdp"].detail == "no world: the world phase did not finish"
    assert len(lines) == len(k3.PHASES)


def test_a_phase_that_hangs_is_ended_before_the_later_phases_time(k3, tmp_path, monkeypatch):
    commands = {"world": "import time; time.sleep(120)", "smoke": "print('smoke ran')"}
    monkeypatch.setattr(k3, "phase_command", lambda name, *_, **__: [sys.executable, "-c", commands[name]])
    scale = dataclasses.replace(k3.SMALL, estimates={"world": 1, "forward": 1, "plain": 1, "fsdp": 1, "smoke": 3})
    options = k3.parse_args(["--device", "cpu", "--small"])
    outcomes = k3.run_phases(options, scale, tmp_path, k3.Budget(9.0), echo=lambda line: None)
    # the world may take the budget less the later phases' 6 s: about 3 s, then it is ended
    assert outcomes["world"].status == "stopped" and outcomes["world"].detail.startswith("ended at its limit")
    assert [outcomes[p].status for p in ("forward", "plain", "fsdp")] == ["not run"] * 3
    assert outcomes["smoke"].status == "finished"


# ----------------------------------------------------------------------------- the anchor search


def fake_probe(phases, largest: int, seen: list[int]):
    def probe(anchors: int):
        seen.append(anchors)
        return phases.Probe(anchors, anchors <= largest, 1.0)
    return probe


def test_the_search_doubles_then_halves_to_the_largest_fitting(phases):
    seen: list[int] = []
    result = phases.search_anchors(fake_probe(phases, 1500, seen), start=512, start_seconds=1.0, capacity=4031,
                                   max_probes=9, time_left=lambda: 1e9, recovers=True)
    assert seen == [1024, 2048, 1536, 1280, 1408, 1472] and (result.fits, result.fails) == (1472, 1536)
    assert result.stopped == "converged"


def test_the_search_stops_at_an_error_other_than_memory(phases):
    def probe(anchors: int):
        return phases.Probe(anchors, anchors <= 1024, 1.0, error=None if anchors <= 1024 else "RuntimeError: int32",
                        fatal=anchors > 1024)

    result = phases.search_anchors(probe, start=512, start_seconds=1.0, capacity=4031, max_probes=9,
                                   time_left=lambda: 1e9, recovers=True)
    assert [p.anchors for p in result.probes] == [1024, 2048] and result.fits == 1024
    assert result.stopped == "error at 2048 anchors: RuntimeError: int32"


def test_the_search_stops_at_the_sequence_s_anchors_when_all_fit(phases):
    seen: list[int] = []
    result = phases.search_anchors(fake_probe(phases, 10**6, seen), start=512, start_seconds=1.0, capacity=4031,
                                   max_probes=9, time_left=lambda: 1e9, recovers=True)
    assert seen == [1024, 2048, 4031] and (result.fits, result.fails) == (4031, None)
    assert result.stopped.startswith("every anchor of the sequence (4031)")


@pytest.mark.parametrize("limits, stopped, seen", [
    ({"max_probes": 2}, "2 probes taken", [1024, 2048]),
    ({"recovers": False}, "a step failed, and this torch's FSDP2 cannot reset", [1024, 2048]),
    # a step at 1024 anchors is estimated at (1024 / 512)^2 x 10 s = 40 s: 30 s left is too little
    ({"time_left": lambda: 30.0}, "budget: a step at 1024 anchors would not finish in time", []),
])
def test_the_search_is_bounded(phases, limits, stopped, seen):
    probes: list[int] = []
    options = {"max_probes": 9, "time_left": lambda: 1e9, "recovers": True, **limits}
    result = phases.search_anchors(fake_probe(phases, 1500, probes), start=512, start_seconds=10.0, capacity=4031,
                                   **options)
    assert probes == seen and result.stopped.startswith(stopped) and result.fits == (1024 if seen else 512)


# ----------------------------------------------------------------------------- the checks


def variant(value: float) -> dict:
    return {"hidden": value, "logits": value, "top1_agreement": 1.0, "seconds": 0.1}


CAST = "bf16 weights, RoPE frequencies cast too (model.to(bfloat16); reported)"


def forward(**changes) -> dict:
    variants = {"float32": variant(1e-6), "bf16 autocast (training)": variant(0.02), CAST: variant(0.3),
                "bf16 weights (serving)": variant(0.03)}
    variants.update(changes)
    return {"device": {"device": "cuda:0"}, "variants": {k: v for k, v in variants.items() if v is not None}}


def test_forward_within_tolerances_passes(k3):
    assert [c.ok for c in k3.forward_checks(forward())] == [True, True, True]


@pytest.mark.parametrize("changes, failing", [
    ({"float32": variant(2e-3)}, 0),
    ({"bf16 autocast (training)": variant(0.5)}, 1),
    ({"bf16 weights (serving)": variant(math.nan)}, 2),
    ({"bf16 weights (serving)": {"error": "RuntimeError: no kernel for BFloat16", "ok": False}}, 2),
])
def test_forward_beyond_a_tolerance_fails_that_variant(k3, changes, failing):
    assert [c.ok for c in k3.forward_checks(forward(**changes))] == [i != failing for i in range(3)]


def test_a_forward_variant_that_did_not_run_is_not_judged(k3):
    assert [c.ok for c in k3.forward_checks(forward(**{"bf16 weights (serving)": None}))] == [True, True, None]
    assert [c.ok for c in k3.forward_checks(None)] == [None] * 3


def test_the_bf16_cast_of_rope_is_reported_not_judged(k3, phases):
    assert phases.BF16_CAST_ROPE == CAST and CAST not in k3.FORWARD_TOLERANCES
    assert k3.forward_notes(forward()) == [f"forward, {CAST}: relative L2: hidden 3.00e-01, logits 3.00e-01"]


def steps(losses, peak=60 * 2**30, whole=None) -> list[dict]:
    """Step records whose distillation loss is `losses` (and whose whole loss is `whole`, default the same)."""
    return [{"step": i + 1, "distillation": loss, "loss": loss if whole is None else whole[i], "confidence": 0.5,
             "peak_memory_bytes": peak, "wall_seconds": 1.0, "tokens": 4031, "reserved_bytes": peak + 2**30}
            for i, loss in enumerate(losses)]


FALLING = [3.0, 2.6, 2.2, 2.0, 1.9, 1.8, 1.7, 1.6]
SEARCH = {"stopped": "converged", "probes": [{"anchors": 1024, "fits": True}, {"anchors": 2048, "fits": False,
                                                                               "error": "CUDA out of memory."}]}
FATAL = {"stopped": "error at 2048 anchors", "probes": [{"anchors": 2048, "fits": False, "fatal": True,
                                                         "error": "RuntimeError: index out of range"}]}


def trained(losses=FALLING, peak=60 * 2**30, search=SEARCH, whole=None) -> dict:
    return {"steps": steps(losses, peak, whole), "search": search}


def test_a_run_whose_loss_falls_with_the_states_on_the_device_passes(k3):
    assert [c.ok for c in k3.training_checks("plain", trained(), k3.K3)] == [True] * 4


def test_the_confidence_term_s_jumps_are_reported_not_judged(k3):
    # measured at K3's width on the CPU: the distillation loss fell, the confidence term's BCE went to ~20
    run = trained(whole=[2.23, 1.81, 7.36, 21.3, 9.17, 2.48, 20.8, 20.5])
    checks = k3.training_checks("plain", run, k3.K3)
    assert [c.ok for c in checks] == [True] * 4 and "the whole loss 2.2300 -> 20.5000" in checks[1].detail


@pytest.mark.parametrize("run, failing", [
    (trained([3.0, 2.95, 2.9, 2.9, 2.85, 2.8, 2.8, 2.75]), [1]),           # fell by less than 10%
    (trained([3.0, 2.6, 2.2, math.nan, 1.9, 1.8, 1.7, 1.6]), [0, 1]),       # a non-finite loss
    (trained(whole=[3.0, 2.6, 2.2, math.inf, 1.9, 1.8, 1.7, 1.6]), [0, 1]), # a non-finite whole loss
    (trained(FALLING[:5]), [0]),                                            # stopped early
    (trained(peak=20 * 2**30), [2]),                                        # the states were not all there
    (trained(search=FATAL), [3]),                                           # a larger step broke
])
def test_a_run_that_does_not_train_fails(k3, run, failing):
    assert [c.ok for c in k3.training_checks("fsdp", run, k3.K3)] == [i not in failing for i in range(4)]


def test_a_run_ended_before_its_search_leaves_the_search_unjudged(k3):
    assert [c.ok for c in k3.training_checks("plain", trained(search=None), k3.K3)] == [True, True, True, None]
    assert [c.ok for c in k3.training_checks("plain", None, k3.K3)] == [None] * 4


def test_the_k3_run_uses_the_trainer_s_defaults_where_the_docs_do(k3):
    from dspark_hub.train.finetuning.config import default

    # docs/k3-scale.md's command: --anchors 512 --loss-chunk 409 --lr 3e-4, bf16; the trainer's defaults
    assert (k3.K3.anchors, k3.K3.loss_chunk, k3.K3.lr) == (default("max_anchors"), default("loss_chunk"),
                                                           default("lr")) == (512, 409, 3e-4)
    assert k3.K3.anchor_capacity == 4096 - 64 - 1


def test_the_states_the_peak_must_hold_are_k3_s(k3):
    # 2,387,907,841 trained x 16 B + 1,174,405,120 frozen x 4 B + the head 163,840 x 7,168 x 4 B
    assert k3.held_bytes(k3.K3) == 2_387_907_841 * 16 + 1_174_405_120 * 4 + 163_840 * 7_168 * 4


BASE = {"layers.0.mlp.up_proj.weight": [0.1, -0.2, 0.3, 0.0], "markov_head.markov_w1.weight": [0.5, 0.5, 0.5, 0.5],
        "embed_tokens.weight": [1.0, 2.0, 3.0, 4.0]}
TRAINED = {**BASE, "layers.0.mlp.up_proj.weight": [0.1003, -0.2003, 0.2997, 0.0003]}


def runs(fsdp_prints=None, fsdp_losses=FALLING):
    world = {"fingerprint": BASE, "frozen": ["embed_tokens.weight"]}
    return ({"steps": steps(FALLING), "fingerprint": TRAINED},
            {"steps": steps(fsdp_losses), "fingerprint": TRAINED if fsdp_prints is None else fsdp_prints}, world)


def test_fsdp_that_computes_what_one_process_computes_passes(k3):
    # markov_w1's sampled rows saw no token of the task, so they move in neither run: that is no failure
    assert [c.ok for c in k3.agreement_checks(*runs())] == [True, True]
    # sums in another order: within the tolerance
    assert [c.ok for c in k3.agreement_checks(*runs(fsdp_losses=[x * 1.005 for x in FALLING]))] == [True, True]


@pytest.mark.parametrize("fsdp_prints, fsdp_losses, failing, words", [
    (None, [3.0, 2.9, 2.8, 2.7, 2.6, 2.5, 2.4, 2.3], 0, "largest relative difference 4.4e-01"),
    (BASE, FALLING, 1, "moved in the plain run only"),
    ({**TRAINED, "embed_tokens.weight": [1.0, 2.0, 3.0, 4.5]}, FALLING, 1, "is frozen but changed"),
    ({k: v for k, v in TRAINED.items() if k != "layers.0.mlp.up_proj.weight"}, FALLING, 1, "missing from the FSDP2"),
    ({**TRAINED, "layers.0.mlp.up_proj.weight": [0.1003, -0.1997, 0.2997, 0.0003]}, FALLING, 1, "relative L2 1.00e+00"),
])
def test_fsdp_that_trains_differently_fails(k3, fsdp_prints, fsdp_losses, failing, words):
    checks = k3.agreement_checks(*runs(fsdp_prints, fsdp_losses))
    assert [c.ok for c in checks] == [i != failing for i in range(2)] and words in checks[failing].detail


def test_agreement_needs_both_runs(k3):
    plain, _, world = runs()
    assert [c.ok for c in k3.agreement_checks(plain, None, world)] == [None, None]
    assert [c.ok for c in k3.agreement_checks(plain, {"steps": steps(FALLING)}, world)] == [True, None]


# ----------------------------------------------------------------------------- the docs say what the script does


def test_the_docs_table_has_the_script_s_columns_and_its_activation_rows(k3):
    text = read("docs/k3-scale.md")
    assert k3.TABLE_HEADER in text
    assert f"| {k3.DOCS_ACTIVATION_PER_ANCHOR / 2**20:.1f} MiB |" in text
    assert f"| {k3.DOCS_ACTIVATION_PER_ROW / 2**10:.0f} KiB |" in text


def test_a_parent_told_to_stop_ends_its_running_phase(tmp_path):
    """`timeout` stops the parent with SIGTERM: the phase it is running (its own process group) must not outlive it
    and hold the GPU's memory."""
    pid_file = tmp_path / "pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    parent = subprocess.Popen([sys.executable, "-c", f"""
import os, signal, sys
sys.path.insert(0, {str(BENCH)!r})
import gpu_k3
signal.signal(signal.SIGTERM, gpu_k3.stop_when_told)
gpu_k3.run_child([sys.executable, "-c", {child!r}], timeout=120, env=os.environ, echo=lambda line: None)
"""])
    for _ in range(600):
        if pid_file.is_file() and pid_file.read_text():
            break
        time.sleep(0.1)
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=60) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
