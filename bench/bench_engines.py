"""Teacher engines and trainer steps side by side: transformers vs vLLM rollouts, ours vs speculators' DSpark step.

Usage:
    python bench/bench_engines.py --vllm-python "$(.ci/venv-vllm.sh)" \\
        --speculators-python /path/to/speculators-venv/bin/python [--runs 5] [--json out.json]

1. Rollouts: the same trained tiny Llama teacher (hidden 64, 6 layers, 2 heads x head_dim 32, float32)
   and the same 32 prompts of 16 tokens, 128 greedy tokens each (EOS ignored), written by
   `make_rollouts` with `--engine transformers` and with `--engine vllm` (the engine process in the
   vLLM virtualenv). Each run is a fresh process; the engines alternate; medians of `--runs`. Reported:
   continuation tokens/s of the second `make_rollouts` call on the open engine (the engine start and
   the first call, which pays one-time costs, are reported apart; a call includes writing the folder
   and, for vLLM, reading the extraction files back) and peak RSS (for vLLM, the parent's and the
   engine process's).
2. One training step on the same tiny configuration and data (8 of those sequences, 16 anchors
   per sequence, block 7, ce 0.1 + tv 0.9 + confidence, AdamW, clip 1.0, float32): ours
   (`Trainer.train_step`, the k3_dspark draft: 2 MLA layers) vs speculators' `DSparkDraftModel`
   (2 GQA layers built by its own `create_transformer_layer_config` from the same teacher, eager
   attention and eager losses, the same sequences packed in one row, 8 x 16 anchors), each in its own
   process and virtualenv. Reported: median step time, time per supervised token, trainable and
   total parameters, peak RSS. The decoders differ (MLA vs GQA), so per-token time is the number
   to compare, next to the parameter counts.

Every process runs one torch thread; the load average is printed with the results, since other
work on a shared machine moves every number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS, PROMPT_LEN, NEW_TOKENS = 32, 16, 128
STEP_SEQUENCES, STEP_ANCHORS, STEP_RUNS = 8, 16, 20
VLLM_OPTIONS = {"dtype": "float32", "kv_cache_memory_bytes": 256 << 20}


def build_world(root: Path) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    from tests.teacher_factory import build_teacher, write_draft_base, write_prompts

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    build_teacher(root / "teacher", steps=150, num_attention_heads=2, num_key_value_heads=2)
    write_draft_base(root / "base", root / "teacher")
    write_prompts(root / "prompts.jsonl", count=PROMPTS, seed=11, length=PROMPT_LEN)


# ----------------------------------------------------------------------------- one measurement per process


def one_rollouts(root: Path, engine_name: str, vllm_python: str | None) -> dict:
    import torch

    from dspark_hub.train.data.rollouts import make_rollouts
    from dspark_hub.train.target.engines import EngineOptions, open_engine, peak_rss_bytes

    torch.set_num_threads(1)
    config = json.loads((root / "base" / "config.json").read_text())
    options = EngineOptions(**VLLM_OPTIONS, python=vllm_python) if engine_name == "vllm" else EngineOptions()
    engine = open_engine(engine_name, str(root / "teacher"), config["target_layer_ids"], options)
    started = time.perf_counter()
    if engine_name == "vllm":
        engine.start()
    else:
        engine._model()
    start_seconds = time.perf_counter() - started
    calls = []
    for _ in range(2):          # the first call pays one-time costs (vLLM's first batch of a shape: ~1.5 s here)
        out = Path(tempfile.mkdtemp(prefix=f"bench-{engine_name}-", dir=root))
        started = time.perf_counter()
        summary = make_rollouts(root / "teacher", root / "prompts.jsonl", config, out, max_new_tokens=NEW_TOKENS,
                                ignore_eos=True, batch_size=PROMPTS, engine=engine)
        calls.append(time.perf_counter() - started)
    warmup_seconds, seconds = calls
    result = {"engine": engine_name, "tokens": summary.continuation_tokens, "seconds": seconds,
              "tokens_per_second": summary.continuation_tokens / seconds, "start_seconds": start_seconds,
              "warmup_seconds": warmup_seconds,
              "greedy_agreement": summary.greedy_agreement, "peak_rss_bytes": peak_rss_bytes(),
              "engine_peak_rss_bytes": getattr(engine, "peak_rss_bytes", 0), "out": str(out)}
    engine.close()
    return result


def step_batch(root: Path) -> Path:
    """8 rollouts of the transformers engine's folder, saved for both trainers."""
    import torch
    from safetensors.torch import save_file

    from dspark_hub.train.data.rollouts import RolloutData

    folders = sorted(p for p in root.glob("bench-transformers-*") if (p / "manifest.json").is_file())
    data = RolloutData(folders[0])
    rows = [data[i] for i in range(STEP_SEQUENCES)]
    path = root / "step_batch.safetensors"
    save_file({"input_ids": torch.stack([r.input_ids for r in rows]),
               "loss_mask": torch.stack([r.loss_mask for r in rows]),
               "aux_hidden_states": torch.stack([r.aux_hidden_states for r in rows]).float(),
               "final_hidden_states": torch.stack([r.final_hidden_states for r in rows]).float()}, str(path))
    return path


def one_step_ours(root: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    from dspark_hub.train.data.rollouts import MemoryRollouts, Rollout
    from dspark_hub.train.finetuning.trainer import TrainConfig, Trainer
    from dspark_hub.train.target.engines import peak_rss_bytes

    torch.set_num_threads(1)
    batch = load_file(str(root / "step_batch.safetensors"))
    rollouts = MemoryRollouts([Rollout(i, None, batch["input_ids"][i], PROMPT_LEN,
                                       batch["aux_hidden_states"][i].to(torch.bfloat16),
                                       batch["final_hidden_states"][i].to(torch.bfloat16), (0, 0),
                                       batch["loss_mask"][i]) for i in range(STEP_SEQUENCES)])
    trainer = Trainer(TrainConfig(base=str(root / "base"), out=str(root / "unused-out"), data=None, on_policy=True,
                                  steps=STEP_RUNS + 2, lr=3e-4, batch_size=STEP_SEQUENCES, max_anchors=STEP_ANCHORS,
                                  target=str(root / "teacher"), device="cpu", force=True))
    times, tokens = [], 0
    for step in range(STEP_RUNS + 2):
        started = time.perf_counter()
        entry = trainer.train_step(rollouts, step)
        times.append(time.perf_counter() - started)
        tokens = entry["tokens"]
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    median = statistics.median(times[2:])
    return {"trainer": "dspark-hub (k3_dspark, MLA)", "step_seconds": median, "tokens": tokens,
            "seconds_per_token": median / tokens, "trainable_parameters": trainable, "total_parameters": total,
            "peak_rss_bytes": peak_rss_bytes(), "torch": torch.__version__}


SPECULATORS_STEP = r'''
import json, os, statistics, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
torch.set_num_threads(1)
from safetensors.torch import load_file
from speculators.models.dspark import DSparkDraftModel
from speculators.train.cli import create_transformer_layer_config, set_seed
from importlib.metadata import version

root, taps, mask_id, vocab, layers, rank, sequences, anchors, runs = sys.argv[1:10]
taps = json.loads(taps); sequences, anchors, runs = int(sequences), int(anchors), int(runs)
teacher = os.path.join(root, "teacher")
set_seed(0)
layer_config = create_transformer_layer_config(verifier_name_or_path=teacher, num_layers=int(layers),
                                               draft_arch="llama", hidden_act="silu", sliding_window=2048,
                                               full_attention_indices=list(range(int(layers))))
model = DSparkDraftModel.from_training_args(
    verifier_config=layer_config, verifier_name_or_path=teacher, trust_remote_code=False, target_layer_ids=taps,
    draft_attn_impl="eager", block_size=7, draft_vocab_size=int(vocab), mask_token_id=int(mask_id),
    markov_rank=int(rank), markov_head_type="vanilla", enable_confidence_head=True, confidence_head_with_markov=True)
model.train()
kwargs = DSparkDraftModel.get_trainer_kwargs(loss_fn='{"ce":0.1,"tv":0.9}', loss_implementation="eager",
                                             max_anchors=sequences * anchors)[0]
data = load_file(os.path.join(root, "step_batch.safetensors"))
length = data["input_ids"].shape[1]
batch = {"hidden_states": data["aux_hidden_states"].reshape(1, sequences * length, -1),
         "input_ids": data["input_ids"].reshape(1, -1), "loss_mask": data["loss_mask"].reshape(1, -1).long(),
         "verifier_last_hidden_states": data["final_hidden_states"].reshape(1, sequences * length, -1),
         "document_ids": torch.arange(sequences).repeat_interleave(length)[None]}
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4, betas=(0.9, 0.95))
times = []
for step in range(runs + 2):
    started = time.perf_counter()
    _, loss, metrics = model(**batch, **kwargs)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    times.append(time.perf_counter() - started)
tokens = int(batch["loss_mask"].sum())
with open("/proc/self/status") as handle:
    peak = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM:"))
median = statistics.median(times[2:])
print("BENCH-RESULT " + json.dumps({
    "trainer": f"speculators {version('speculators')} (DSparkDraftModel, GQA)", "step_seconds": median,
    "tokens": tokens, "seconds_per_token": median / tokens,
    "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    "total_parameters": sum(p.numel() for p in model.parameters()), "peak_rss_bytes": peak,
    "torch": torch.__version__}))
'''


def one_step_speculators(root: Path, python: str) -> dict:
    from dspark_hub.format.taps import residual_index

    config = json.loads((root / "base" / "config.json").read_text())
    taps = [residual_index(layer) for layer in config["target_layer_ids"]]     # their ids = ours + 1
    args = [str(root), json.dumps(taps), str(config["mask_token_id"]), str(config["draft_vocab_size"]),
            str(config["num_hidden_layers"]), str(config["markov_rank"]), str(STEP_SEQUENCES), str(STEP_ANCHORS),
            str(STEP_RUNS)]
    done = subprocess.run([python, "-c", SPECULATORS_STEP, *args], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""})
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH-RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"speculators step failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("BENCH-RESULT "))


# ----------------------------------------------------------------------------- the driver


def in_child(*args: str) -> dict:
    """Run one measurement in a fresh process of this interpreter (its peak RSS is its own)."""
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH-RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("BENCH-RESULT "))


def mib(value: float) -> str:
    return f"{value / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", help="interpreter with vllm 0.32 (e.g. $(.ci/venv-vllm.sh))")
    parser.add_argument("--speculators-python", help="interpreter with speculators 0.9 installed")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--one", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, root = args.one[0], Path(args.one[1])
        result = one_rollouts(root, args.one[2], args.one[3] if len(args.one) > 3 else None) if kind == "rollouts" \
            else one_step_ours(root)
        print("BENCH-RESULT " + json.dumps(result))
        return

    load_before = os.getloadavg()
    report: dict = {"workload": {"prompts": PROMPTS, "prompt_tokens": PROMPT_LEN, "new_tokens": NEW_TOKENS,
                                 "runs": args.runs, "step_sequences": STEP_SEQUENCES, "step_anchors": STEP_ANCHORS},
                    "load_average_before": load_before}
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        root = Path(tmp)
        build_world(root)
        engines = ["transformers"] + (["vllm"] if args.vllm_python else [])
        runs: dict[str, list[dict]] = {name: [] for name in engines}
        for run in range(args.runs):                      # alternate, so load drifts hit both alike
            for name in engines:
                extra = [args.vllm_python] if name == "vllm" else []
                result = in_child("--one", "rollouts", str(root), name, *extra)
                runs[name].append(result)
                print(f"run {run + 1} {name}: {result['tokens_per_second']:,.0f} tokens/s "
                      f"(start {result['start_seconds']:.1f} s)", flush=True)
        report["rollouts"] = {}
        for name, results in runs.items():
            report["rollouts"][name] = {
                "tokens_per_second_median": statistics.median(r["tokens_per_second"] for r in results),
                "tokens_per_second_runs": [r["tokens_per_second"] for r in results],
                "start_seconds_median": statistics.median(r["start_seconds"] for r in results),
                "warmup_seconds_median": statistics.median(r["warmup_seconds"] for r in results),
                "peak_rss_bytes_median": statistics.median(r["peak_rss_bytes"] for r in results),
                "engine_peak_rss_bytes_median": statistics.median(r["engine_peak_rss_bytes"] for r in results),
                "greedy_agreement": results[-1]["greedy_agreement"], "tokens": results[-1]["tokens"]}
        step_batch(root)
        report["step"] = {"dspark-hub": in_child("--one", "step", str(root))}
        if args.speculators_python:
            report["step"]["speculators"] = one_step_speculators(root, args.speculators_python)
    report["load_average_after"] = os.getloadavg()

    print(f"\nload average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, after "
          f"{report['load_average_after'][0]:.2f} {report['load_average_after'][1]:.2f} "
          f"{report['load_average_after'][2]:.2f} (2 cores shared); one torch thread per process")
    print(f"\nrollouts: {PROMPTS} prompts x {PROMPT_LEN} tokens, {NEW_TOKENS} greedy tokens each, float32, "
          f"median of {args.runs} fresh processes")
    for name, row in report["rollouts"].items():
        engine_rss = f", engine process {mib(row['engine_peak_rss_bytes_median'])}" if name == "vllm" else ""
        print(f"  {name:12s} {row['tokens_per_second_median']:9,.0f} tokens/s  "
              f"start {row['start_seconds_median']:5.1f} s"
              f", first call {row['warmup_seconds_median']:4.2f} s"
              f"  peak RSS {mib(row['peak_rss_bytes_median'])}{engine_rss}  greedy agreement "
              f"{row['greedy_agreement']:.4f}")
    if "vllm" in report["rollouts"]:
        ratio = (report["rollouts"]["vllm"]["tokens_per_second_median"]
                 / report["rollouts"]["transformers"]["tokens_per_second_median"])
        report["rollouts"]["ratio_vllm_over_transformers"] = ratio
        print(f"  ratio vllm / transformers: {ratio:.2f}x tokens/s")
    print(f"\ntraining step: {STEP_SEQUENCES} sequences x {PROMPT_LEN + NEW_TOKENS} tokens, {STEP_ANCHORS} anchors "
          f"per sequence, block 7, median of {STEP_RUNS} steps after 2 warm-up")
    for row in report["step"].values():
        print(f"  {row['trainer']:40s} {row['step_seconds'] * 1000:7.1f} ms/step  "
              f"{row['seconds_per_token'] * 1e6:6.1f} us/token  trainable {row['trainable_parameters']:,} "
              f"of {row['total_parameters']:,} params  peak RSS {mib(row['peak_rss_bytes'])}")
    if "speculators" in report["step"]:
        ours, theirs = report["step"]["dspark-hub"], report["step"]["speculators"]
        ratio = ours["seconds_per_token"] / theirs["seconds_per_token"]
        report["step"]["ratio_ours_over_speculators_per_token"] = ratio
        params = ours["trainable_parameters"] / theirs["trainable_parameters"]
        print(f"  ratio ours / speculators per token: {ratio:.2f} (< 1 = ours faster); "
              f"trainable parameters {params:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
