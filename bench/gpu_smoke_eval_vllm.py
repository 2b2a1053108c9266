"""GPU smoke test: `eval` and `eval --engine vllm` on a k3_dspark draft, where vLLM's MLA path runs.

Usage (a machine with CUDA GPUs and vLLM 0.32.0 importable, or its interpreter given):
    python bench/gpu_smoke_eval_vllm.py                        # tiny world: build, measure, check
    python bench/gpu_smoke_eval_vllm.py --world smollm2        # SmolLM2-135M-Instruct (.ci/real-target.sh)
    python bench/gpu_smoke_eval_vllm.py --world smollm2 --draft DIR   # a trained draft (the real recipe's)
    python bench/gpu_smoke_eval_vllm.py --vllm-python PY       # vLLM in another virtualenv
    python bench/gpu_smoke_eval_vllm.py --no-engine            # everything but vLLM (checks the script on CPU)

Worlds (docs/gpu-smoke.md):

- `tiny` (the default: offline, nothing to download, a few minutes on CPU): the word-language Llama
  teacher of the training tests (hidden 64, 6 layers, vocabulary 512; one head of 64, a head size every
  GPU attention backend takes), a tiny k3_dspark draft (the tiny profile with Kimi-K3's MLA head geometry,
  `kv_lora_rank` 512, `qk_rope_head_dim` 64, `qk_nope_head_dim`/`v_head_dim` 128, so vLLM's MLA backends
  accept it; taps [1, 3, 4]) fine-tuned `--steps` steps on the teacher's rollouts, and 8 held-out prompts.
- `smollm2`: the real target SmolLM2-135M-Instruct (`.ci/real-target.sh` builds and caches it; `--target`
  names another folder), the first `--heldout N` prompts of bench/prompts/smollm2-heldout.jsonl, and a
  k3_dspark draft sized by `init --target T --mla-widths-from kimi-k3` (Kimi-K3's MLA widths, T's heads
  and hidden size), fine-tuned `--steps` steps on rollouts of the first `--train N` train prompts as
  the real recipe does (bench/real_recipe.py). `--draft DIR` takes a trained draft instead; it must
  pair with the target (`verify DIR --target T`) and have those MLA widths.

`--workdir DIR` keeps the world and reuses it on the next run. Then it runs `dspark-hub eval`
(simulated, with the untrained draft as `--reference` and prompt lookup as the baseline) and
`dspark-hub eval --engine vllm` (vLLM serves the target with the draft, `method: dspark`, k = 7) on the
same prompts and checks:

- the simulation drafts, and the draft accepts more than nothing;
- the vLLM run is lossless (its outputs equal plain greedy decoding's) and says what ran
  (`measured_by`: vLLM 0.32.0, the speculative config with the draft and k = 7, the runner);
- in float32, `drafts` and `accepted_per_position` are EQUAL to the simulation's; if the GPU's MLA
  backend refuses float32 it falls back to bfloat16 (`--dtype`), where only closeness can be
  expected (|acceptance length difference| <= 0.1), and says so.

It prints each step's wall time, the JSON summaries (the draft, the untrained base, prompt lookup) and
the verdict. Exit codes: 0 every check passed; 1 a check failed or a run crashed; 77 no GPU here
(nothing measured; `--no-engine` still checks the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from real_recipe import PROMPTS, first_lines  # noqa: E402  (bench/, beside this script)

NO_GPU = 77
COUNTS = ("drafts", "accepted_per_position", "tokens", "k")
#: The profile whose MLA widths vLLM's GPU MLA backends take (kv_lora_rank 512, rope 64, nope/v 128).
GPU_MLA_PROFILE = "kimi-k3"


#: The tiny draft's heads; its MLA widths are GPU_MLA_PROFILE's (the tiny profile's own are smaller than GPU MLA
#: kernels take).
TINY_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 64}


class Failed(Exception):
    """A step of the smoke test failed; the message says which and why (exit 1)."""


def build_tiny_world(root: Path, args: argparse.Namespace) -> dict[str, Path]:
    """Teacher (trained word language), a fine-tuned tiny k3_dspark draft, its base, held-out prompts (reused)."""
    world = {"teacher": root / "teacher", "draft": root / "draft", "base": root / "base",
             "prompts": root / "heldout.jsonl"}
    if all(path.exists() for path in world.values()):
        return world
    from dspark_hub.format import contract
    from dspark_hub.ops.init import init_checkpoint
    from dspark_hub.ops.target_draft import MLA_WIDTH_KEYS
    from dspark_hub.train.data.rollouts import make_rollouts

    sys.path.insert(0, str(ROOT / "tests"))
    from teacher_factory import build_teacher, write_prompts

    build_teacher(root / "teacher", num_attention_heads=1, num_key_value_heads=1)
    widths = {key: contract.PROFILES[GPU_MLA_PROFILE][key] for key in MLA_WIDTH_KEYS}
    init_checkpoint(root / "base", config={**contract.TINY_CONFIG, **TINY_HEADS, **widths}, force=True)
    _copy_embedding(root / "teacher", root / "base")
    write_prompts(root / "train.jsonl", count=64, seed=3, length=12)
    write_prompts(root / "heldout.jsonl", count=8, seed=12, length=12)
    make_rollouts(root / "teacher", root / "train.jsonl", root / "base" / "config.json", root / "data",
                  max_new_tokens=48, ignore_eos=True, batch_size=32, force=True)
    _cli("finetune", "--base", root / "base", "--data", root / "data", "--out", root / "draft", "--steps", args.steps,
         "--lr", 3e-3, "--warmup", 10, "--batch-size", 8, "--anchors", 16, "--force", "--json")
    return world


def _copy_embedding(teacher: Path, draft: Path) -> None:
    """The draft's frozen embed_tokens is the teacher's (as the contract and vLLM expect)."""
    import torch
    from safetensors.torch import load_file, save_file

    embed = load_file(str(teacher / "model.safetensors"))["model.embed_tokens.weight"]
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["embed_tokens.weight"] = embed.to(torch.bfloat16).contiguous()
    save_file(dict(sorted(tensors.items())), str(draft / "model.safetensors"), metadata={"format": "pt"})


def build_smollm2_world(root: Path, args: argparse.Namespace) -> dict[str, Path]:
    """SmolLM2, held-out prompts, an untrained base with GPU MLA widths and the draft (given, or trained here)."""
    target = args.target or real_target()
    world = {"teacher": target, "draft": args.draft or root / "draft", "base": root / "base",
             "prompts": first_lines(PROMPTS / "smollm2-heldout.jsonl", args.heldout, root / "heldout.jsonl")}
    sizing = ["--target", target, "--mla-widths-from", GPU_MLA_PROFILE, "--force"]
    if args.draft:
        config = check_given_draft(args.draft, target)
        sizing += ["--taps", ",".join(map(str, config["target_layer_ids"])), "--layers", config["num_hidden_layers"]]
    if args.draft or not world["base"].exists():     # a given draft's base has its taps, whatever was here
        _cli("init", world["base"], *sizing, "--json")
    if not world["draft"].exists():
        train_smollm2_draft(root, world, args)
    return world


def real_target() -> Path:
    """The f32 SmolLM2 folder `.ci/real-target.sh` prints (built and cached on the first call)."""
    done = subprocess.run(["bash", str(ROOT / ".ci" / "real-target.sh")], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable}, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise Failed(f".ci/real-target.sh exited {done.returncode}: {done.stderr.strip()[-1000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def check_given_draft(draft: Path, target: Path) -> dict:
    """`--draft`'s config, once it pairs with the target and has the MLA widths vLLM's GPU backends take."""
    from dspark_hub.format import contract
    from dspark_hub.ops.target_draft import MLA_WIDTH_KEYS

    done = _cli("verify", draft, "--target", target, "--json", check=False)
    if done.returncode != 0:
        raise Failed(f"{draft} does not pair with {target} (verify --target exited {done.returncode}): "
                     f"{_error_findings(done)}")
    config = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    widths = {key: config.get(key) for key in MLA_WIDTH_KEYS}
    wanted = {key: contract.PROFILES[GPU_MLA_PROFILE][key] for key in MLA_WIDTH_KEYS}
    if widths != wanted:
        raise Failed(f"{draft}/config.json has MLA widths {widths}; vLLM's GPU MLA backends take {wanted} "
                     f"(size the draft with init --target T --mla-widths-from {GPU_MLA_PROFILE})")
    return config


def _error_findings(done: subprocess.CompletedProcess[str]) -> str:
    """`verify --json`'s error findings as `CODE: message; ...`, or its stderr's last line."""
    try:
        findings = json.loads(done.stdout)["findings"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return (done.stderr.strip().splitlines() or ["no output"])[-1]
    return "; ".join(f"{f['code']}: {f['message']}" for f in findings if f["severity"] == "error")


def train_smollm2_draft(root: Path, world: dict[str, Path], args: argparse.Namespace) -> None:
    """The real recipe's rollouts and finetune (bench/real_recipe.py), at this run's sizes."""
    train = first_lines(PROMPTS / "smollm2-train.jsonl", args.train, root / "train.jsonl")
    threads = ["--threads", args.threads] if args.threads else []
    _cli("rollouts", "--teacher", world["teacher"], "--prompts", train, "--draft-config", world["base"] / "config.json",
         "--out", root / "train-data", "--max-new-tokens", args.max_new_tokens, "--batch-size", 16, *threads,
         "--force", "--json")
    _cli("finetune", "--base", world["base"], "--data", root / "train-data", "--teacher", world["teacher"],
         "--out", world["draft"], "--steps", args.steps, "--batch-size", args.batch_size, "--anchors", args.anchors,
         "--warmup", max(1, args.steps // 20), "--lr", 1e-3, *threads, "--force", "--json")


WORLDS = {"tiny": build_tiny_world, "smollm2": build_smollm2_world}
#: Per world: (--steps, --max-new-tokens) when not given.
DEFAULTS = {"tiny": (150, 32), "smollm2": (300, 96)}


def _cli(*args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One `dspark-hub` command in its own process; its wall time is printed."""
    command = [sys.executable, "-m", "dspark_hub", *map(str, args)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    print(f"  {args[0]}: {time.perf_counter() - start:.1f} s, exit {done.returncode}", flush=True)
    if check and done.returncode != 0:
        raise Failed(f"{' '.join(command)}\n{done.stderr[-3000:]}")
    return done


def _eval(world: dict[str, Path], args: argparse.Namespace, *extra: object) -> tuple[int, dict | None, str]:
    threads = ["--threads", args.threads] if args.threads else []
    done = _cli("eval", "--draft", world["draft"], "--teacher", world["teacher"], "--prompts", world["prompts"],
                "--max-new-tokens", args.max_new_tokens, *threads, "--json", *extra, check=False)
    try:
        return done.returncode, json.loads(done.stdout), done.stderr
    except json.JSONDecodeError:
        return done.returncode, None, done.stderr


def _summary(doc: dict) -> dict:
    keep = {key: doc[key] for key in (*COUNTS, "acceptance_length", "engine", "lossless")}
    for name, key in (("untrained base", "reference"), ("prompt lookup", "baseline")):
        if doc.get(key):
            keep[name] = {k: doc[key][k] for k in ("acceptance_length", "per_position")}
    if doc.get("measured_by"):
        keep["measured_by"] = {k: doc["measured_by"][k] for k in ("vllm_version", "model_runner", "triton_interpret",
                                                                   "dtype", "platform", "speculative_config",
                                                                   "timing_s")}
    return keep


def simulate(world: dict[str, Path], args: argparse.Namespace) -> tuple[dict, list[str]]:
    """The simulated eval (with the untrained base as reference) and what is wrong with it."""
    code, simulated, err = _eval(world, args, "--reference", world["base"])
    if code != 0 or simulated is None:
        raise Failed(f"simulated eval exited {code}\n{err[-3000:]}")
    print("simulated:", json.dumps(_summary(simulated)))
    failures = [] if simulated["drafts"] > 0 and simulated["k"] == 7 else ["the simulation drafted nothing"]
    if simulated["acceptance_length"] <= 1.0:
        failures.append("the fine-tuned draft accepts nothing in the simulation; more --steps")
    return simulated, failures


def measure(world: dict[str, Path], args: argparse.Namespace) -> tuple[dict, str]:
    """`eval --engine vllm` in float32, or in bfloat16 when the GPU's MLA backend refuses float32."""
    engine = ["--engine", "vllm", *(["--vllm-python", args.vllm_python] if args.vllm_python else [])]
    code, measured, err = _eval(world, args, *engine)
    dtype = "float32"
    if measured is None and "dtype" in err.lower():
        print(f"vLLM refused float32 ({err.strip().splitlines()[-1][:300]}); measuring in bfloat16")
        dtype = "bfloat16"
        code, measured, err = _eval(world, args, *engine, "--dtype", dtype)
    if measured is None:
        raise Failed(f"eval --engine vllm exited {code}\n{err[-3000:]}")
    print("measured: ", json.dumps(_summary(measured)))
    return measured, dtype


def parity_failures(simulated: dict, measured: dict, dtype: str) -> list[str]:
    """Lossless, the pinned engine with the draft at k = 7, and counts equal (float32) or close (bfloat16)."""
    from dspark_hub.vllm.pin import PINNED_VERSION as VLLM_VERSION

    by = measured["measured_by"]
    spec = by["speculative_config"]
    failures = [] if measured["lossless"] else ["vLLM's outputs differ from plain greedy decoding's"]
    if by["vllm_version"] != VLLM_VERSION or spec["method"] != "dspark" or spec["num_speculative_tokens"] != 7:
        failures.append(f"unexpected engine: {by['vllm_version']} {spec}")
    if dtype == "float32":
        mismatched = [key for key in COUNTS if measured[key] != simulated[key]]
        if mismatched:
            failures.append(f"simulated and measured differ in {mismatched}")
    elif abs(measured["acceptance_length"] - simulated["acceptance_length"]) > 0.1:
        failures.append("bfloat16: acceptance lengths differ by more than 0.1")
    return failures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", choices=sorted(WORLDS), default="tiny", help="tiny (offline) or smollm2.")
    parser.add_argument("--workdir", type=Path, help="Keep the world here (default: a temporary folder).")
    parser.add_argument("--steps", type=int, help="Draft fine-tuning steps (default: tiny 150, smollm2 300).")
    parser.add_argument("--max-new-tokens", type=int, help="Per prompt, rollouts and eval (default: tiny 32, "
                        "smollm2 96).")
    parser.add_argument("--target", type=Path, help="smollm2: the target folder (default: .ci/real-target.sh's).")
    parser.add_argument("--draft", type=Path, help="smollm2: a trained k3_dspark draft for the target (no training).")
    parser.add_argument("--train", type=int, default=200, help="smollm2: train prompts for the rollouts.")
    parser.add_argument("--heldout", type=int, default=40, help="smollm2: held-out prompts measured.")
    parser.add_argument("--batch-size", type=int, default=8, help="smollm2: finetune sequences per step.")
    parser.add_argument("--anchors", type=int, default=16, help="smollm2: finetune anchors per sequence.")
    parser.add_argument("--threads", type=int, help="CPU threads of each dspark-hub command (default: theirs).")
    parser.add_argument("--vllm-python", help="Python of a vLLM 0.32.0 virtualenv (default: this one).")
    parser.add_argument("--no-engine", action="store_true", help="Skip vLLM: build, simulate and stop.")
    args = parser.parse_args(argv)
    if args.world == "tiny" and (args.target or args.draft):
        parser.error("--target and --draft are for --world smollm2")
    steps, tokens = DEFAULTS[args.world]
    args.steps = steps if args.steps is None else args.steps
    args.max_new_tokens = args.max_new_tokens or tokens
    return args


def main() -> int:
    args = parse_args()
    import torch

    if not torch.cuda.is_available() and not args.no_engine:
        print("no CUDA GPU here: vLLM's MLA path for a k3_dspark draft does not run on CPU "
              "(use --no-engine to check the rest of this script)")
        return NO_GPU
    root = args.workdir or Path(tempfile.mkdtemp(prefix="dspark-gpu-eval-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        world = WORLDS[args.world](root, args)
        simulated, failures = simulate(world, args)
        if args.no_engine:
            return verdict(failures, f"--no-engine: vLLM not run; world in {root}")
        measured, dtype = measure(world, args)
    except Failed as failed:
        print(f"FAILED: {failed}")
        return 1
    failures += parity_failures(simulated, measured, dtype)
    parity = "exact parity (float32)" if dtype == "float32" else "bfloat16: close, exact parity not expected"
    return verdict(failures, f"lossless, {parity}; world in {root}")


def verdict(failures: list[str], ok: str) -> int:
    """Print the verdict line; the exit code (0 ok, 1 failed)."""
    print(("FAILED: " + "; ".join(failures)) if failures else f"OK: {ok}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
