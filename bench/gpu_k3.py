"""Kimi-K3 scale on one GPU: the full-size k3_dspark draft built, checked against the CPU, and trained.

Usage:
    python bench/gpu_k3.py --budget-s 450 --json out.json    # one CUDA GPU, full size (under 8 min on an H200)
    python bench/gpu_k3.py --device cpu --small              # the same code paths on CPU at the tiny profile
    python bench/gpu_k3.py --phases plain --workdir DIR      # some phases; a world already in DIR is reused

Phases, each in a process of its own, in this order (the elapsed time is printed after each):
  world    a random teacher head of K3's width (`lm_head` and embedding, 163,840 x 7,168, nothing else),
           the reference draft `init --profile kimi-k3 --embed-from` it (3,562,312,961 parameters), and
           synthetic rollouts of the right width (5 taps x 7,168 plus the final hidden state) on a
           learnable task: the tokens cycle with period 8, and the teacher's distribution at each position
           puts 98% on the next token of the cycle;
  forward  the draft's teacher-forced forward on a few anchors: float32 on the CPU is the reference for the
           device's float32, bf16 autocast (what training runs) and bf16 weights (what serving runs);
  plain    `finetune`'s Trainer at docs/k3-scale.md's per-rank settings on one GPU (bf16, --anchors 512,
           --loss-chunk 409, one 4,096-token sequence a step, lr 3e-4) for a few steps, then a bounded
           search for the largest --anchors whose step fits on the device;
  fsdp     the same under `torchrun --nproc-per-node 1` with FSDP2 (`fully_shard`, world size 1);
  smoke    `bench/gpu_smoke.py --nproc 1` (DDP and FSDP2 against a CPU reference, tiny, float32).

The checks (their tolerances and why: `forward_checks`, `training_checks`, `agreement_checks`): the device's
float32 forward within 1e-3 relative L2 of the CPU's, its bf16 forwards within 0.1; in each training run
the distillation loss (the loss without its confidence term, which is reported) falls by 10% or more, the
device's peak holds at least the fp32 states plus the teacher head, and the anchor search meets no error
but running out of memory; the FSDP2 run's distillation losses within 1e-2 of the plain run's at every
step, its weight updates within 0.1 relative L2 of the plain run's, the frozen embedding unchanged in
both; gpu_smoke passes. It prints a JSON summary (also written to --json), one Markdown table (per
configuration: step time, tokens and anchors per second, peak device memory against docs/k3-scale.md's
computed per-rank figure and the trainer's own plan, the largest --anchors that fits, the losses), the
checks, the phases that did not finish, and the verdict.

`--budget-s` is a hard stop: a phase starts only with its estimated time left, runs at most until the
later phases' estimates are all that is left (then it is ended), and its anchor search stops before
that; the report lists what did not finish. `--device cpu --small` runs every phase's code but CUDA's
(gloo instead of nccl, the tiny profile); `--simulate-oom forward:N` or `backward:N` makes a step with
more than N anchors raise an out-of-memory error at that point, so that the search's recovery runs on
a CPU too.

Exit codes: 0 every check of the phases asked for passed; 1 a check failed, a phase crashed or did not
run within the budget; 2 usage; 77 no CUDA GPU here (nothing ran).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
sys.path.insert(0, str(ROOT))

from _gpu_k3_phases import (  # noqa: E402 (after the source tree goes on the path: the phases import dspark_hub)
    FINGERPRINT_SAMPLES,
    GIB,
    K3,
    SMALL,
    Scale,
    build_world,
    forward_check,
    train_run,
    world_paths,
    write_json,
)

NO_GPU = 77
PHASES = ("world", "forward", "plain", "fsdp", "smoke")
SEARCH_MARGIN_S = 15          # a training phase's search ends this long before the phase's limit
NEEDS_WORLD = ("forward", "plain", "fsdp")

# The forward check's tolerances (`forward_checks` says why); the other variants are reported.
FORWARD_TOLERANCES = {"float32": 1e-3, "bf16 autocast (training)": 0.1, "bf16 weights (serving)": 0.1}

# The training checks' tolerances (`training_checks`, `agreement_checks` say why).
LOSS_FALL = 0.9               # the last step's loss at most this x the first step's
LOSS_AGREEMENT = 1e-2         # FSDP2 vs plain, relative, per step
UPDATE_AGREEMENT = 0.1        # FSDP2 vs plain weight updates, relative L2

# docs/k3-scale.md's activation rows (measured by bench/bench_k3_memory.py at K3 width) and its ~1 GiB
# for the loss chunk's tensors: the computed per-rank figure is rebuilt from them at world size 1.
DOCS_ACTIVATION_PER_ANCHOR = 26.9 * 2**20
DOCS_ACTIVATION_PER_ROW = 672 * 2**10
DOCS_LOSS_ALLOWANCE = 1 * GIB


# ============================================================================ the phases (parent process)


@dataclass
class PhaseOutcome:
    """How a phase went: `finished` (its process exited 0), `failed` (another exit), `stopped` (ended at the
    budget), `not run` (no time left for it, or no world), `not asked` (--phases left it out)."""

    name: str
    status: str
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Budget:
    seconds: float
    started: float = field(default_factory=time.monotonic)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.seconds - self.elapsed()


def stop_group(process: subprocess.Popen[str]) -> None:
    """End a child and what it started (its own process group, `torchrun`'s workers too), gently first."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(command: list[str], *, timeout: float, env: Mapping[str, str],
              echo: Callable[[str], None] = print) -> tuple[int | None, bool, float, list[str]]:
    """Run `command` in a process group of its own (in this session, so that whatever ends this session's
    processes ends it too), echoing its output indented, and end the group after `timeout` seconds or when
    this process is told to stop. Returns (exit code, whether it was ended at the timeout, seconds, the last
    lines it printed)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, process_group=0)
    tail: deque[str] = deque(maxlen=40)

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            tail.append(line.rstrip())
            echo(f"    {line.rstrip()}")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    stopped = False
    try:
        process.wait(timeout=max(timeout, 0.0))
    except subprocess.TimeoutExpired:
        stopped = True
    finally:
        if process.poll() is None:
            stop_group(process)
    reader.join(timeout=10)
    return process.returncode, stopped, time.perf_counter() - started, list(tail)


def stop_when_told(signum: int, frame: Any) -> None:
    """SIGTERM (from `timeout`, say) ends the parent as Ctrl-C would: the running phase's group goes with it."""
    raise SystemExit(128 + signum)


def child_env(small: bool) -> dict[str, str]:
    """The children's environment: the source tree first on the path, offline, unbuffered; one thread a
    process in the small mode (the CPU test runs on a busy 2-core machine)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    if small:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def phase_command(name: str, options: argparse.Namespace, workdir: Path, deadline: float) -> list[str]:
    if name == "smoke":
        return [sys.executable, str(ROOT / "bench" / "gpu_smoke.py"), "--nproc", "1", "--device", options.device]
    role = "train" if name in ("plain", "fsdp") else name
    args = [str(SCRIPT), "--role", role, "--workdir", str(workdir), "--device", options.device]
    args += ["--small"] if options.small else []
    if role == "train":
        args += ["--label", name, "--deadline", f"{deadline:.3f}"]
        args += ["--simulate-oom", options.simulate_oom] if options.simulate_oom else []
    if name == "fsdp":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", *args, "--fsdp"]
    return [sys.executable, *args]


def run_phases(options: argparse.Namespace, scale: Scale, workdir: Path, budget: Budget,
               echo: Callable[[str], None] = print) -> dict[str, PhaseOutcome]:
    """Each phase asked for, in order, while the budget lasts. A phase starts only with its estimated time
    left; it may run into the slack but not into the later phases' estimates (then it is ended), and its
    anchor search stops SEARCH_MARGIN_S before that, so the process ends in time."""
    outcomes: dict[str, PhaseOutcome] = {}
    env = child_env(options.small)
    for index, name in enumerate(PHASES):
        need = scale.estimates[name]
        if name not in options.phases:
            outcomes[name] = PhaseOutcome(name, "not asked")
            continue
        if name in NEEDS_WORLD and outcomes["world"].status != "finished":
            outcomes[name] = PhaseOutcome(name, "not run", detail="no world: the world phase did not finish")
        elif budget.left() < need:
            outcomes[name] = PhaseOutcome(name, "not run", detail=f"budget: {max(budget.left(), 0):.0f} s left, "
                                          f"the phase needs about {need:.0f} s")
        if name in outcomes:
            echo(f"[{name}] not run: {outcomes[name].detail}")
            continue
        later = sum(scale.estimates[p] for p in PHASES[index + 1:] if p in options.phases)
        limit = min(budget.left(), max(need, budget.left() - later))
        echo(f"[{name}] {budget.left():.0f} s of the budget left; this phase may take {limit:.0f} s")
        command = phase_command(name, options, workdir, deadline=time.time() + limit - SEARCH_MARGIN_S)
        code, stopped, seconds, tail = run_child(command, timeout=limit, env=env, echo=echo)
        status = "stopped" if stopped else "finished" if code == 0 else "failed"
        detail = (f"ended at its limit, {limit:.0f} s" if stopped else
                  f"exit {code}: {tail[-1] if tail else '(no output)'}" if code else "")
        outcomes[name] = PhaseOutcome(name, status, seconds, detail)
        echo(f"[{name}] {status} in {seconds:.1f} s; {budget.elapsed():.1f} s of {budget.seconds:.0f} s used")
    return outcomes


# ============================================================================ checks and report (parent process)


@dataclass
class Check:
    name: str
    ok: bool | None          # None: it could not be judged (its phase did not run or did not get that far)
    detail: str


def read_result(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def held_bytes(scale: Scale) -> int:
    """What a step must hold on the device at least: fp32 weights, gradients and AdamW moments of the trained
    parameters, fp32 frozen embedding, and the teacher head in fp32."""
    from dspark_hub.format import contract

    config = contract.profile_config(scale.profile)
    counts = contract.parameter_counts(config)
    return counts.trained * 16 + counts.frozen * 4 + config["vocab_size"] * config["target_hidden_size"] * 4


def docs_per_rank_bytes(fsdp: bool, anchors: int, rows: int) -> float:
    """docs/k3-scale.md's computed per-rank memory, at world size 1: the states (not divided), the teacher
    head, the activations per anchor block and per context row, ~1 GiB of loss chunk tensors, and under
    FSDP2 the all-gathered root unit plus two decoder layers (prefetch)."""
    from bench_k3_memory import computed  # beside this script

    c = computed(1)
    total = (c["states_per_rank_bytes"] + c["teacher_lm_head_fp32_bytes"] + anchors * DOCS_ACTIVATION_PER_ANCHOR
             + rows * DOCS_ACTIVATION_PER_ROW + DOCS_LOSS_ALLOWANCE)
    return total + (2 * c["layer_gather_bytes"] + c["root_gather_bytes"] if fsdp else 0)


def forward_checks(forward: dict[str, Any] | None) -> list[Check]:
    """float32 on the device within 1e-3 relative L2 of float32 on the CPU: the same arithmetic in another
    order (float32 keeps 24 bits; sums of ~10^4 terms in another order differ by ~1e-6), so more than 1e-3
    means another computation. bf16 within 0.1: bf16 keeps 8 bits (each rounding 2^-8 = 0.4%), and every
    layer rounds its inputs; on the CPU, at K3's width (5 layers, vocabulary cut to 8,192, context 256,
    these 4 anchors) bf16 autocast measured 0.027 and bf16 weights 0.028, while leaving attention out moves
    the output by 1.41, and casting RoPE's frequencies to bf16 as well (reported, not judged: serving keeps
    them in float32) by 0.119. A variant not in FORWARD_TOLERANCES is reported (`forward_notes`)."""
    variants = (forward or {}).get("variants", {})
    device = (forward or {}).get("device", {}).get("device", "the device")
    checks = []
    for name, tolerance in FORWARD_TOLERANCES.items():
        v = variants.get(name)
        title = f"forward on {device}, {name}, against float32 on the CPU"
        if v is None or "error" in v:
            checks.append(Check(title, None if v is None else False, "not run" if v is None else v["error"]))
            continue
        checks.append(Check(title, v["hidden"] <= tolerance and v["logits"] <= tolerance,
                            f"relative L2: hidden {v['hidden']:.2e}, logits {v['logits']:.2e} (tolerance "
                            f"{tolerance:g}); top-1 agreement {v['top1_agreement']:.2f} (reported)"))
    return checks


def forward_notes(forward: dict[str, Any] | None) -> list[str]:
    """The forward variants reported, not judged."""
    variants = (forward or {}).get("variants", {})
    return [f"forward, {name}: " + (v["error"] if "error" in v else
                                    f"relative L2: hidden {v['hidden']:.2e}, logits {v['logits']:.2e}")
            for name, v in variants.items() if name not in FORWARD_TOLERANCES]


def training_checks(label: str, run: dict[str, Any] | None, scale: Scale) -> list[Check]:
    """The run took every step with finite losses; its distillation loss (`ce` and `tv` as the trainer weighs
    them) fell by (1 - LOSS_FALL) at least (the task is learnable: a run whose updates do not reach the
    weights keeps its first loss); the step's peak held at least the fp32 states and the teacher head (else
    they were not all on the device); the anchor search's larger steps failed, if at all, for memory only.

    The confidence term is reported, not judged: at these settings (lr 3e-4 after 2 warmup steps) Adam moves
    each of the head's 7,424 inputs' weights by ~lr a step, so its logits jump; at K3's width on the CPU (one
    layer, vocabulary 16,384) its BCE went 0.21 -> 6.4 -> 20.4 within 8 steps while ce fell 11.2 -> 1.9 and
    tv 1.00 -> 0.65."""
    steps = (run or {}).get("steps")
    titles = (f"{label}: {scale.steps} steps, finite losses", f"{label}: the distillation loss falls",
              f"{label}: the peak holds the fp32 states and the teacher head",
              f"{label}: the anchor search met no error but running out of memory")
    if not steps:
        return [Check(title, None, "not run") for title in titles]
    search = (run or {}).get("search")
    errors = [p["error"] for p in (search or {}).get("probes", []) if p.get("fatal")]
    losses = [s["distillation"] for s in steps]
    finite = all(isinstance(x, float) and math.isfinite(x) for x in losses + [s["loss"] for s in steps])
    peak, need = max(s["peak_memory_bytes"] for s in steps), held_bytes(scale)
    return [Check(titles[0], finite and len(steps) == scale.steps, f"{len(steps)} steps"),
            Check(titles[1], finite and losses[-1] <= LOSS_FALL * losses[0],
                  f"{losses[0]:.4f} -> {losses[-1]:.4f} (at most {LOSS_FALL} x the first); the whole loss "
                  f"{steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}, confidence "
                  f"{steps[0].get('confidence', 0.0):.4f} -> {steps[-1].get('confidence', 0.0):.4f} (reported)"),
            Check(titles[2], peak >= need, f"peak {gib(peak)} GiB, states + head {gib(need)} GiB"),
            Check(titles[3], None if search is None else not errors,
                  "not run" if search is None else errors[0] if errors else search["stopped"])]


def update_difference(base: Mapping[str, list[float]], plain: Mapping[str, list[float]],
                      fsdp: Mapping[str, list[float]], frozen: Iterable[str]) -> tuple[float, list[str]]:
    """The two runs' weight updates (after - base) compared on the sampled elements: relative L2 of their
    difference over every trained tensor, and what is wrong besides (a tensor missing from a run, a frozen
    tensor changed, a tensor that moved in one run only)."""
    frozen = set(frozen)
    problems: list[str] = []
    difference = norm = 0.0
    for name, before in base.items():
        runs = {"plain": plain.get(name), "FSDP2": fsdp.get(name)}
        missing = [run for run, values in runs.items() if values is None]
        if missing:
            problems.append(f"{name} missing from the {missing[0]} run's weights")
            continue
        plain_step, fsdp_step = ([a - b for a, b in zip(values, before, strict=True)] for values in runs.values())
        if name in frozen:
            if any(plain_step) or any(fsdp_step):
                problems.append(f"{name} is frozen but changed")
            continue
        if any(plain_step) != any(fsdp_step):
            problems.append(f"{name} moved in the {'plain' if any(plain_step) else 'FSDP2'} run only")
        difference += sum((a - b) ** 2 for a, b in zip(plain_step, fsdp_step, strict=True))
        norm += sum(a * a for a in plain_step)
    return (math.sqrt(difference / norm) if norm else math.inf), problems


def largest_difference(plain_steps: list[dict[str, Any]], fsdp_steps: list[dict[str, Any]], key: str) -> float:
    """The largest relative difference of `key` between the runs' steps."""
    return max(abs(a[key] - b[key]) / max(abs(a[key]), 1e-12) for a, b in zip(plain_steps, fsdp_steps, strict=False))


def agreement_checks(plain: dict[str, Any] | None, fsdp: dict[str, Any] | None,
                     world: dict[str, Any] | None) -> list[Check]:
    """FSDP2 at world size 1 computes what one process computes: its per-step distillation losses within
    LOSS_AGREEMENT (relative) of the plain run's (only the order of some sums on the device may differ: a
    run that trains differently drifts by the loss's fall, 10% or more; the whole loss's difference is
    reported), and its weight updates within UPDATE_AGREEMENT relative L2 (AdamW's first steps are near
    sign(gradient), so an element whose gradient is within rounding of zero may step the other way in one
    run; updates that do not reach the weights differ by 1)."""
    titles = ("FSDP2 vs plain: distillation loss at every step",
              "FSDP2 vs plain: weight updates, frozen embedding unchanged")
    plain_steps, fsdp_steps = (plain or {}).get("steps"), (fsdp or {}).get("steps")
    if not (plain_steps and fsdp_steps):
        return [Check(title, None, "not run (needs both runs)") for title in titles]
    worst = largest_difference(plain_steps, fsdp_steps, "distillation")
    checks = [Check(titles[0], len(plain_steps) == len(fsdp_steps) and worst <= LOSS_AGREEMENT,
                    f"largest relative difference {worst:.1e} over {min(len(plain_steps), len(fsdp_steps))} steps "
                    f"(tolerance {LOSS_AGREEMENT:g}); the whole loss's "
                    f"{largest_difference(plain_steps, fsdp_steps, 'loss'):.1e} (reported)")]
    prints = [(run or {}).get("fingerprint") for run in (world, plain, fsdp)]
    if not all(prints):
        return [*checks, Check(titles[1], None, "not run (a run's weights were not gathered)")]
    relative, problems = update_difference(*prints, frozen=world.get("frozen", ()) if world else ())
    return [*checks, Check(titles[1], relative <= UPDATE_AGREEMENT and not problems,
                           f"relative L2 {relative:.2e} (tolerance {UPDATE_AGREEMENT:g}) over "
                           f"{FINGERPRINT_SAMPLES} sampled elements a tensor" + "".join(f"; {p}" for p in problems))]


def check_results(outcomes: Mapping[str, PhaseOutcome], results: Mapping[str, Any], scale: Scale) -> list[Check]:
    """Every check of the phases asked for."""
    checks: list[Check] = []
    asked = {name for name, outcome in outcomes.items() if outcome.status != "not asked"}
    if "forward" in asked:
        checks += forward_checks(results.get("forward"))
    for label in ("plain", "fsdp"):
        if label in asked:
            checks += training_checks(label, results.get(label), scale)
    if {"plain", "fsdp"} <= asked:
        checks += agreement_checks(results.get("plain"), results.get("fsdp"), results.get("world"))
    if "smoke" in asked:
        smoke = outcomes["smoke"]
        checks.append(Check("bench/gpu_smoke.py --nproc 1", None if smoke.status == "not run" else
                            smoke.status == "finished", smoke.detail or "PASS"))
    return checks


def configuration_summary(label: str, run: dict[str, Any], scale: Scale) -> dict[str, Any]:
    """Step time (median of the steps after the first), tokens and anchors per second, memory, the search."""
    steps = run.get("steps") or []
    timed = steps[1:] or steps
    seconds = statistics.median(s["wall_seconds"] for s in timed) if timed else None
    tokens = statistics.median(s["tokens"] for s in timed) if timed else None
    anchors = min(scale.anchors, scale.anchor_capacity) * scale.batch_size
    reserved = [s["reserved_bytes"] for s in steps if s.get("reserved_bytes")]
    search = run.get("search") or {}
    return {"label": label, "world_size": run.get("world_size"), "steps": len(steps),
            "step_seconds": seconds, "tokens_per_second": tokens / seconds if seconds else None,
            "anchors_per_second": anchors / seconds if seconds else None, "anchors_per_step": anchors,
            "peak_bytes": max((s["peak_memory_bytes"] for s in steps), default=None),
            "reserved_bytes": max(reserved, default=None),
            "plan_bytes": (run.get("plan") or {}).get("memory_total_bytes"),
            "docs_bytes": docs_per_rank_bytes(label == "fsdp", anchors, scale.length * scale.batch_size)
            if scale is K3 else None,
            "largest_anchors": search.get("fits"), "smallest_failing_anchors": search.get("fails"),
            "search_stopped": search.get("stopped"), "probes": [[p["anchors"], p["fits"], round(p["seconds"], 2)]
                                                                for p in search.get("probes", [])],
            "losses": [round(s["loss"], 5) for s in steps],
            "distillation_losses": [round(s["distillation"], 5) for s in steps],
            "confidence_losses": [round(s.get("confidence", 0.0), 5) for s in steps],
            "setup_seconds": run.get("setup_seconds")}


def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.3g}"


TABLE_HEADER = ("| configuration | steps | step time, s (median) | tokens/s | anchors/s | peak, GiB | reserved, GiB "
                "| docs per rank, GiB (computed) | trainer's plan, GiB (computed) | largest --anchors that fits "
                "| distillation loss, first -> last | whole loss, first -> last |")


def table(summaries: Mapping[str, dict[str, Any]]) -> str:
    names = {"plain": "plain (1 process)", "fsdp": "FSDP2 (torchrun, world size 1)"}
    lines = [TABLE_HEADER, "|" + " --- |" * TABLE_HEADER.count(" | ") + " --- |"]
    for label, s in summaries.items():
        largest = "-" if s["largest_anchors"] is None else (
            f"{s['largest_anchors']:,}" + (f" ({s['smallest_failing_anchors']:,} did not)"
                                           if s["smallest_failing_anchors"] else " (every anchor)"))
        rate = "-" if s["step_seconds"] is None else f"{s['step_seconds']:.3f}"
        per_second = ["-" if s[k] is None else f"{s[k]:,.0f}" for k in ("tokens_per_second", "anchors_per_second")]
        losses = [f"{s[k][0]:.4f} -> {s[k][-1]:.4f}" if s[k] else "-" for k in ("distillation_losses", "losses")]
        lines.append(f"| {names[label]} | {s['steps']} | {rate} | {' | '.join(per_second)} | {gib(s['peak_bytes'])} "
                     f"| {gib(s['reserved_bytes'])} | {gib(s['docs_bytes'])} | {gib(s['plan_bytes'])} | {largest} "
                     f"| {' | '.join(losses)} |")
    return "\n".join(lines)


def summarize(outcomes: Mapping[str, PhaseOutcome], workdir: Path, scale: Scale, budget: Budget) -> dict[str, Any]:
    """Everything measured and judged, as one JSON-able document (`ok`: every check passed, every phase asked
    for finished)."""
    results = {"world": read_result(world_paths(workdir)["stamp"]), "forward": read_result(workdir / "forward.json"),
               "plain": read_result(workdir / "train-plain.json"), "fsdp": read_result(workdir / "train-fsdp.json")}
    checks = check_results(outcomes, results, scale)
    incomplete = [o for o in outcomes.values() if o.status not in ("finished", "not asked")]
    devices = [r["device"] for r in (results["forward"], results["plain"], results["fsdp"]) if r and "device" in r]
    forward = results["forward"]
    return {"bench": "gpu_k3", "ok": all(c.ok for c in checks) and not incomplete, "scale": scale.name,
            "device": devices[0] if devices else None, "budget_s": budget.seconds, "elapsed_s": budget.elapsed(),
            "phases": {name: asdict(o) for name, o in outcomes.items()}, "checks": [asdict(c) for c in checks],
            "not_run": [f"{o.name}: {o.status}" + (f" ({o.detail})" if o.detail else "") for o in incomplete],
            "notes": forward_notes(forward),
            "forward": {k: forward[k] for k in ("variants", "context_rows", "anchors", "reference_seconds")}
            if forward else None,
            "configurations": {label: configuration_summary(label, results[label], scale)
                               for label in ("plain", "fsdp") if results[label] and results[label].get("steps")},
            "world": {k: results["world"][k] for k in ("parameters", "bytes", "seconds")} if results["world"] else None}


def report(summary: Mapping[str, Any]) -> str:
    """The JSON summary, then the table, the checks and the verdict (the last lines are what a log's tail shows)."""
    device = summary["device"] or {}
    lines = ["JSON summary:", json.dumps(summary, separators=(",", ":")), "",
             f"gpu_k3 ({summary['scale']}): {device.get('name', '?')}, torch {device.get('torch', '?')}, "
             f"CUDA {device.get('cuda') or '-'}; {summary['elapsed_s']:.0f} s of a {summary['budget_s']:.0f} s budget",
             "", table(summary["configurations"]), ""]
    lines += [f"{'PASS' if c['ok'] else 'FAIL' if c['ok'] is False else 'NOT RUN'} {c['name']}: {c['detail']}"
              for c in summary["checks"]]
    lines += [f"NOTE {note}" for note in summary["notes"]]
    lines += [f"NOT RUN phase {entry}" for entry in summary["not_run"]]
    passed = sum(1 for c in summary["checks"] if c["ok"])
    lines.append(f"\ngpu_k3: {'PASS' if summary['ok'] else 'FAIL'} ({passed} of {len(summary['checks'])} checks passed"
                 + (f"; {len(summary['not_run'])} phases did not finish" if summary["not_run"] else "") + ")")
    return "\n".join(lines)


# ============================================================================ command line


def cuda_visible() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Phases: " + ", ".join(PHASES) + ". See the module docstring.")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--small", action="store_true", help="the tiny profile (the CPU test; seconds)")
    parser.add_argument("--budget-s", type=float, help=f"hard stop in seconds [default {K3.budget_s:.0f}; "
                        f"--small {SMALL.budget_s:.0f}]")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated; world is added when needed")
    parser.add_argument("--workdir", type=Path, help="keep the world and results here, and reuse a world found there")
    parser.add_argument("--json", type=Path, help="also write the JSON summary to this file")
    parser.add_argument("--simulate-oom", metavar="forward:N|backward:N",
                        help="steps with more than N anchors raise CUDA's out-of-memory error (tests the search)")
    # the children's own options
    parser.add_argument("--role", choices=["world", "forward", "train"], help=argparse.SUPPRESS)
    parser.add_argument("--label", choices=["plain", "fsdp"], help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--fsdp", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    phases = [p.strip() for p in options.phases.split(",") if p.strip()]
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        parser.error(f"--phases: {', '.join(unknown) or 'none given'}; choose from {', '.join(PHASES)}")
    if any(p in NEEDS_WORLD for p in phases):
        phases.append("world")
    options.phases = tuple(p for p in PHASES if p in phases)
    where, _, limit = (options.simulate_oom or "forward:0").partition(":")
    if where not in ("forward", "backward") or not limit.isdigit():
        parser.error(f"--simulate-oom: {options.simulate_oom!r}; use forward:N or backward:N")
    if options.device == "cpu" and not options.small:
        parser.error("--device cpu: the full size needs a GPU (about 62 GiB a step); add --small")
    return options


def child_main(options: argparse.Namespace) -> NoReturn:
    """One phase's process. It ends with `os._exit`: its results are written, and the interpreter's teardown
    with torch and transformers loaded takes seconds a process on a busy machine."""
    scale = SMALL if options.small else K3
    if options.role == "world":
        build_world(options.workdir, scale)
    else:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        if options.role == "forward":
            write_json(options.workdir / "forward.json", forward_check(options.workdir, scale, options.device))
        else:
            train_run(options.workdir, scale, options.device, options.label, fsdp=options.fsdp,
                      deadline=options.deadline, simulate=options.simulate_oom)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    if options.role:
        child_main(options)
    if options.device == "cuda" and not cuda_visible():
        import torch

        print(f"gpu_k3: no GPU: torch {torch.__version__} sees no CUDA device, so nothing ran; run it where one "
              "is visible, or with --device cpu --small to check the script")
        return NO_GPU
    signal.signal(signal.SIGTERM, stop_when_told)
    scale = SMALL if options.small else K3
    budget = Budget(options.budget_s or scale.budget_s)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="dspark-gpu-k3-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"gpu_k3: {scale.name} on {options.device}, phases {', '.join(options.phases)}, budget "
          f"{budget.seconds:.0f} s, files in {workdir}", flush=True)
    try:
        outcomes = run_phases(options, scale, workdir, budget, echo=lambda line: print(line, flush=True))
        summary = summarize(outcomes, workdir, scale, budget)
    finally:
        if options.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report(summary))
    if options.json:
        options.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
