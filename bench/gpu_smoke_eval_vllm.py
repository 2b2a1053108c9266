"""GPU smoke test: `eval` and `eval --engine vllm` on a k3_dspark draft, where vLLM's MLA path runs.

Usage (a machine with CUDA GPUs and vLLM 0.32.0 importable, or its interpreter given):
    python bench/gpu_smoke_eval_vllm.py                        # build the world, measure, check
    python bench/gpu_smoke_eval_vllm.py --vllm-python PY       # vLLM in another virtualenv
    python bench/gpu_smoke_eval_vllm.py --no-engine            # everything but vLLM (checks the script on CPU)

It builds a tiny world in a temporary folder (a few minutes on CPU): the word-language Llama teacher
of the training tests (hidden 64, 6 layers, vocabulary 512; one head of 64, a head size every GPU
attention backend takes), a tiny k3_dspark draft (the tiny profile with Kimi-K3's MLA head geometry,
`kv_lora_rank` 512, `qk_rope_head_dim` 64, `qk_nope_head_dim`/`v_head_dim` 128, so vLLM's MLA
backends accept it; taps [1, 3, 4]) fine-tuned `--steps` steps on the teacher's rollouts, and 8
held-out prompts. `--workdir DIR` keeps the world and reuses it on the next run. Then it runs
`dspark-hub eval` (simulated) and `dspark-hub eval --engine vllm` (vLLM serves the teacher with the
draft, `method: dspark`, k = 7) on the same prompts and checks:

- the vLLM run is lossless (its outputs equal plain greedy decoding's) and says what ran
  (`measured_by`: vLLM 0.32.0, the speculative config with the draft and k = 7, the runner);
- in float32, `drafts` and `accepted_per_position` are EQUAL to the simulation's; if the GPU's MLA
  backend refuses float32 it falls back to bfloat16 (`--dtype`), where only closeness can be
  expected (|acceptance length difference| <= 0.1), and says so.

It prints both JSON summaries and the verdict. Exit codes: 0 every check passed; 1 a check failed or
a run crashed; 77 no GPU here (nothing measured; `--no-engine` still checks the rest).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NO_GPU = 77
COUNTS = ("drafts", "accepted_per_position", "tokens", "k")


#: Kimi-K3's MLA head geometry on the tiny draft (the tiny profile's own heads are smaller than GPU MLA kernels take).
MLA_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 512,
             "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}


def build_world(root: Path, steps: int) -> dict[str, Path]:
    """Teacher (trained word language), a fine-tuned tiny k3_dspark draft, held-out prompts (reused when built)."""
    world = {"teacher": root / "teacher", "draft": root / "draft", "prompts": root / "heldout.jsonl"}
    if all(path.exists() for path in world.values()):
        return world
    from dspark_hub.format import contract
    from dspark_hub.ops.init import init_checkpoint
    from dspark_hub.train.rollouts import make_rollouts

    sys.path.insert(0, str(ROOT / "tests"))
    from teacher_factory import build_teacher, write_prompts

    build_teacher(root / "teacher", num_attention_heads=1, num_key_value_heads=1)
    init_checkpoint(root / "base", config={**contract.TINY_CONFIG, **MLA_HEADS}, force=True)
    _copy_embedding(root / "teacher", root / "base")
    write_prompts(root / "train.jsonl", count=64, seed=3, length=12)
    write_prompts(root / "heldout.jsonl", count=8, seed=12, length=12)
    make_rollouts(root / "teacher", root / "train.jsonl", root / "base" / "config.json", root / "data",
                  max_new_tokens=48, ignore_eos=True, batch_size=32, force=True)
    _cli("finetune", "--base", root / "base", "--data", root / "data", "--out", root / "draft", "--steps", steps,
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


def _cli(*args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dspark_hub", *map(str, args)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if check and done.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(command)}\n{done.stderr[-3000:]}")
    return done


def _eval(world: dict[str, Path], max_new_tokens: int, *extra: object) -> tuple[int, dict | None, str]:
    done = _cli("eval", "--draft", world["draft"], "--teacher", world["teacher"], "--prompts", world["prompts"],
                "--max-new-tokens", max_new_tokens, "--json", *extra, check=False)
    try:
        return done.returncode, json.loads(done.stdout), done.stderr
    except json.JSONDecodeError:
        return done.returncode, None, done.stderr


def _summary(doc: dict) -> dict:
    keep = {key: doc[key] for key in (*COUNTS, "acceptance_length", "engine", "lossless")}
    if doc.get("measured_by"):
        keep["measured_by"] = {k: doc["measured_by"][k] for k in ("vllm_version", "model_runner", "triton_interpret",
                                                                   "dtype", "platform", "speculative_config",
                                                                   "timing_s")}
    return keep


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="Keep the world here (default: a temporary folder).")
    parser.add_argument("--steps", type=int, default=150, help="Draft fine-tuning steps.")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--vllm-python", help="Python of a vLLM 0.32.0 virtualenv (default: this one).")
    parser.add_argument("--no-engine", action="store_true", help="Skip vLLM: build, simulate and stop.")
    args = parser.parse_args()

    import torch

    from dspark_hub.vllm.pin import PINNED_VERSION as VLLM_VERSION

    gpu = torch.cuda.is_available()
    if not gpu and not args.no_engine:
        print("no CUDA GPU here: vLLM's MLA path for a k3_dspark draft does not run on CPU "
              "(use --no-engine to check the rest of this script)")
        return NO_GPU
    root = args.workdir or Path(tempfile.mkdtemp(prefix="dspark-gpu-eval-"))
    root.mkdir(parents=True, exist_ok=True)
    world = build_world(root, args.steps)
    code, simulated, err = _eval(world, args.max_new_tokens)
    if code != 0 or simulated is None:
        print(f"FAILED: simulated eval exited {code}\n{err[-3000:]}")
        return 1
    print("simulated:", json.dumps(_summary(simulated)))
    failures = [] if simulated["drafts"] > 0 and simulated["k"] == 7 else ["the simulation drafted nothing"]
    if simulated["acceptance_length"] <= 1.0:
        failures.append("the fine-tuned draft accepts nothing in the simulation; more --steps")
    if args.no_engine:
        print("--no-engine: vLLM not run")
        return 1 if failures else 0

    engine = ["--engine", "vllm", *(["--vllm-python", args.vllm_python] if args.vllm_python else [])]
    code, measured, err = _eval(world, args.max_new_tokens, *engine)
    dtype = "float32"
    if measured is None and "dtype" in err.lower():
        print(f"vLLM refused float32 ({err.strip().splitlines()[-1][:300]}); measuring in bfloat16")
        dtype = "bfloat16"
        code, measured, err = _eval(world, args.max_new_tokens, *engine, "--dtype", dtype)
    if measured is None:
        print(f"FAILED: eval --engine vllm exited {code}\n{err[-3000:]}")
        return 1
    print("measured: ", json.dumps(_summary(measured)))
    by = measured["measured_by"]
    spec = by["speculative_config"]
    if not measured["lossless"]:
        failures.append("vLLM's outputs differ from plain greedy decoding's")
    if by["vllm_version"] != VLLM_VERSION or spec["method"] != "dspark" or spec["num_speculative_tokens"] != 7:
        failures.append(f"unexpected engine: {by['vllm_version']} {spec}")
    if dtype == "float32":
        mismatched = [key for key in COUNTS if measured[key] != simulated[key]]
        if mismatched:
            failures.append(f"simulated and measured differ in {mismatched}")
    elif abs(measured["acceptance_length"] - simulated["acceptance_length"]) > 0.1:
        failures.append("bfloat16: acceptance lengths differ by more than 0.1")
    verdict = "exact parity (float32)" if dtype == "float32" else "bfloat16: close, exact parity not expected"
    print(("FAILED: " + "; ".join(failures)) if failures else f"OK: lossless, {verdict}; world in {root}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
