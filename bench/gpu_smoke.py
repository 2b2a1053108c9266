"""GPU smoke test: one DDP and one FSDP2 `finetune` run on the GPUs here, checked against a CPU run.

Usage:
    python bench/gpu_smoke.py                 # every visible GPU (torchrun --nproc-per-node = GPU count)
    python bench/gpu_smoke.py --nproc 2       # two of them
    python bench/gpu_smoke.py --device cpu    # the same runs with gloo on CPU: checks the script, no GPU needed

It builds a tiny world in a temporary folder (a random tiny Llama teacher, its rollouts, a random
k3_dspark draft; seconds on CPU), then runs `dspark-hub finetune` for `--steps` steps three times on
the same global batch: one CPU process (the reference), `torchrun` DDP on the devices, and
`torchrun --fsdp` (FSDP2 over a device mesh). Each sharded run must reproduce the reference's loss
at every step (rtol 1e-3) and its trained weights (atol 1e-3); float32 throughout. It prints what
ran: torch and CUDA versions, each GPU's name and memory, world size, backend, and per step the
time, tokens/s and peak device memory the trainer logged.

Exit codes: 0 every check passed; 1 a check failed or a run crashed; 77 no GPU here (nothing ran).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

NO_GPU = 77


def build_world(root: Path) -> dict[str, Path]:
    """Teacher, rollouts and draft, all tiny and seeded (the same world every run)."""
    from transformers import LlamaForCausalLM

    from dspark_hub.ops.init import init_checkpoint
    from dspark_hub.train.data.rollouts import make_rollouts

    sys.path.insert(0, str(ROOT / "tests"))
    from teacher_factory import teacher_config, write_prompts
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    LlamaForCausalLM(teacher_config()).save_pretrained(str(root / "teacher"))
    init_checkpoint(root / "base", profile="tiny", embed_from=root / "teacher")
    write_prompts(root / "prompts.jsonl", count=32, seed=7, length=16)
    make_rollouts(root / "teacher", root / "prompts.jsonl", root / "base" / "config.json", root / "data",
                  max_new_tokens=48, ignore_eos=True, batch_size=32)
    return {"teacher": root / "teacher", "base": root / "base", "data": root / "data"}


def finetune_args(world: dict[str, Path], out: Path, steps: int, batch: int) -> list[str]:
    return ["finetune", "--base", str(world["base"]), "--data", str(world["data"]), "--teacher", str(world["teacher"]),
            "--out", str(out), "--steps", str(steps), "--batch-size", str(batch), "--anchors", "16", "--lr", "3e-3",
            "--warmup", "1", "--seed", "5", "--save-every", str(steps), "--quiet", "--force"]


def run(label: str, command: list[str], cwd: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        print(f"FAIL {label}: exit {done.returncode}\n{done.stderr[-4000:]}")
        sys.exit(1)
    return seconds


def results(out: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    state_dir = Path(f"{out}.state")
    pointer = json.loads((state_dir / "latest.json").read_text())
    model = torch.load(state_dir / pointer["file"], weights_only=False)["model"]
    return [entry for entry in log if "loss" in entry], model


def describe_devices(device: str) -> str:
    lines = [f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL "
             f"{'.'.join(map(str, torch.cuda.nccl.version())) if device == 'cuda' else '-'}"]
    if device == "cuda":
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            lines.append(f"  cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, help="processes (GPUs) per run [default: every visible GPU; 2 on CPU]")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--keep", type=Path, help="keep the world and outputs in this folder")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_smoke: no GPU: torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is "
              "False), so nothing ran. Run it where a GPU is visible, or with --device cpu to check the script.")
        return NO_GPU
    nproc = args.nproc or (torch.cuda.device_count() if args.device == "cuda" else 2)
    if args.device == "cuda" and nproc > torch.cuda.device_count():
        print(f"gpu_smoke: --nproc {nproc} but torch sees {torch.cuda.device_count()} GPUs")
        return 1
    batch = max(8, nproc)
    backend = "nccl" if args.device == "cuda" else "gloo"
    print(f"gpu_smoke: {describe_devices(args.device)}\n  {args.steps} steps, global batch {batch}, "
          f"world size {nproc}, backend {backend}, float32")
    root = args.keep or Path(tempfile.mkdtemp(prefix="dspark-gpu-smoke-"))
    root.mkdir(parents=True, exist_ok=True)
    world = build_world(root / "world")
    dspark = [sys.executable, "-m", "dspark_hub"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                "-m", "dspark_hub"]
    runs = {"cpu reference (1 process)": dspark + finetune_args(world, root / "cpu", args.steps, batch)
            + ["--device", "cpu"],
            f"DDP x{nproc} on {args.device}": torchrun + finetune_args(world, root / "ddp", args.steps, batch)
            + ["--device", args.device],
            f"FSDP2 x{nproc} on {args.device}": torchrun + finetune_args(world, root / "fsdp", args.steps, batch)
            + ["--device", args.device, "--fsdp"]}
    outs = dict(zip(runs, ("cpu", "ddp", "fsdp"), strict=True))
    reference_log, reference_model = None, None
    failures = 0
    for label, command in runs.items():
        seconds = run(label, command, root)
        log, model = results(root / outs[label])
        print(f"\n{label}: {seconds:.1f} s (process)")
        for entry in log:
            print(f"  step {entry['step']}: loss {entry['loss']:.6f}, {entry['step_seconds'] * 1000:.1f} ms, "
                  f"{entry['tokens_per_second']:,.0f} tokens/s, peak {entry['peak_memory_bytes'] / 2**20:,.1f} MiB "
                  f"on {entry['device']}")
        if reference_log is None:
            reference_log, reference_model = log, model
            continue
        losses = [(a["loss"], b["loss"]) for a, b in zip(reference_log, log, strict=False)]
        loss_ok = len(log) == len(reference_log) and all(abs(a - b) <= 1e-3 * abs(a) + 1e-6 for a, b in losses)
        worst = max((reference_model[n].float() - model[n].float()).abs().max().item() for n in reference_model)
        weights_ok = reference_model.keys() == model.keys() and worst <= 1e-3
        print(f"  vs cpu: losses {'equal' if loss_ok else 'DIFFER'} (rtol 1e-3): "
              + ", ".join(f"{a:.6f}/{b:.6f}" for a, b in losses)
              + f"; weights max |diff| {worst:.2e} {'ok' if weights_ok else 'TOO LARGE'} (atol 1e-3)")
        failures += not (loss_ok and weights_ok)
    kept = failures or args.keep
    print(f"\ngpu_smoke: {'PASS' if not failures else 'FAIL'} ({len(runs) - 1 - failures} of {len(runs) - 1} sharded "
          f"runs match the CPU reference)" + (f"; files in {root}" if kept else ""))
    if not kept:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
