"""One training step of the SAME speculators DSpark, ours against the speculators library, side by side.

Usage:
    python bench/bench_speculators_step.py --speculators-python "$(bash .ci/venv-speculators.sh)" [--runs 5]

The world (made once per invocation by the library itself, in its virtualenv): a random Qwen3 target
(hidden 256, 4 layers, vocabulary 8,192), a DSpark draft built by `DSparkDraftModel.from_training_args`
(2 layers, block 8, vanilla Markov head rank 64, confidence head, taps [1, 2, 3]) and saved with
`save_pretrained`, and one packed row of 4 documents x 256 tokens (64 prompt tokens each) with 256
anchors drawn once. Both trainers load that checkpoint in float32 and run the same step on that row
with those anchors: forward, the library's loss (KL + confidence BCE), backward, clipping at 1.0,
AdamW. The library's step is `DSparkDraftModel.forward` with eager attention and eager losses (its
flex-attention path needs a GPU compiler); ours is `train.objective_speculators`.

Each run is a fresh process of each trainer, the two alternating; per process the median of 8 timed
steps after 2 warm-up steps. Printed: the median over runs of step time, supervised tokens/s and peak
RSS for each, and the median of the per-run ratios ours/theirs (< 1 = ours faster). One torch thread
per process; the load average is printed, since other work on a shared machine moves every number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS, WARMUP = 8, 2

PREPARE = r'''
import json, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from safetensors.torch import save_file
from speculators.models.dspark import DSparkDraftModel
from speculators.models.dflash.utils import select_anchors
from speculators.train.cli import create_transformer_layer_config, set_seed

root = sys.argv[1]
set_seed(0)
target = os.path.join(root, "target")
Qwen3ForCausalLM(Qwen3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=64, vocab_size=8192, max_position_embeddings=2048,
                             tie_word_embeddings=False)).save_pretrained(target)
layer = create_transformer_layer_config(verifier_name_or_path=target, num_layers=2, draft_arch="qwen3",
                                        hidden_act=None, sliding_window=2048, full_attention_indices=[0, 1])
draft = DSparkDraftModel.from_training_args(
    verifier_config=layer, verifier_name_or_path=target, target_layer_ids=[1, 2, 3], block_size=8,
    draft_vocab_size=8192, mask_token_id=8191, draft_attn_impl="eager", markov_rank=64,
    markov_head_type="vanilla", enable_confidence_head=True, confidence_head_with_markov=True)
draft.save_pretrained(os.path.join(root, "draft"))
g = torch.Generator().manual_seed(1)
docs, length, prompt = 4, 256, 64
n = docs * length
mask = torch.cat([torch.cat([torch.zeros(prompt), torch.ones(length - prompt)]) for _ in range(docs)])
torch.manual_seed(2)
anchors, _ = select_anchors(mask[None], 256, 8)
save_file({"taps": torch.randn(n, 3 * 256, generator=g), "input_ids": torch.randint(0, 8191, (n,), generator=g),
           "loss_mask": mask, "last_hidden": torch.randn(n, 256, generator=g),
           "document_ids": torch.arange(docs).repeat_interleave(length), "positions": torch.arange(length).repeat(docs),
           "anchors": anchors}, os.path.join(root, "row.safetensors"))
'''

LIBRARY = r'''
import json, os, statistics, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
torch.set_num_threads(1)
from safetensors.torch import load_file
from speculators.config import SpeculatorModelConfig
from speculators.losses import resolve_loss_config
from speculators.models.dflash import core as dflash_core
from speculators.models.dspark import DSparkDraftModel

root, steps, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.chdir(root)
config = SpeculatorModelConfig.from_pretrained(os.path.join(root, "draft"))
config.transformer_layer_config._attn_implementation = "eager"
model = DSparkDraftModel.from_pretrained(os.path.join(root, "draft"), config=config, dtype=torch.float32)
model.train()
row = load_file(os.path.join(root, "row.safetensors"))
anchors = row["anchors"]
dflash_core.select_anchors = lambda m, n, b: (anchors.clone(), torch.ones(anchors.numel(), dtype=torch.bool))
params = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(params, lr=3e-4)
kwargs = dict(loss_config=resolve_loss_config("kl_div", "eager"),
              tv_loss_fn=resolve_loss_config("tv", "eager")["tv"][0], max_anchors=anchors.numel())
batch = dict(hidden_states=row["taps"][None], input_ids=row["input_ids"][None], loss_mask=row["loss_mask"][None],
             verifier_last_hidden_states=row["last_hidden"][None], document_ids=row["document_ids"][None],
             position_ids=row["positions"][None])
times, losses = [], []
for step in range(warmup + steps):
    started = time.perf_counter()
    _, loss, _ = model(**batch, **kwargs)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    times.append(time.perf_counter() - started)
    losses.append(loss.item())
with open("/proc/self/status") as handle:
    peak = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmHWM:"))
print("BENCH-RESULT " + json.dumps({"step_seconds": statistics.median(times[warmup:]), "peak_rss_bytes": peak,
                                     "losses": losses}))
'''


def ours(root: Path, steps: int, warmup: int) -> dict:
    """Our step, in this process (run as a child of the driver)."""
    import time

    import torch
    from safetensors.torch import load_file

    from dspark_hub.format.jsonio import load_json_object
    from dspark_hub.modeling.speculators_dspark import read_tensors
    from dspark_hub.train.finetuning.objective_speculators import Objective, PackedRow, SpeculatorsDSparkTrainer
    from dspark_hub.train.target.engines import peak_rss_bytes

    torch.set_num_threads(1)
    target = read_tensors(root / "target")
    draft = {k: (v.float() if v.is_floating_point() else v) for k, v in read_tensors(root / "draft").items()}
    trainer = SpeculatorsDSparkTrainer(load_json_object(root / "draft" / "config.json"), draft,
                                       target["model.embed_tokens.weight"].float(), target["lm_head.weight"].float(),
                                       target["model.norm.weight"].float())
    data = load_file(str(root / "row.safetensors"))
    row = PackedRow(taps=data["taps"], input_ids=data["input_ids"], loss_mask=data["loss_mask"],
                    last_hidden=data["last_hidden"], document_ids=data["document_ids"], positions=data["positions"])
    params = trainer.parameters()
    optimizer = torch.optim.AdamW(params, lr=3e-4)
    objective = Objective(loss={"kl_div": 1.0})
    times, losses = [], []
    for _ in range(warmup + steps):
        started = time.perf_counter()
        loss = trainer.loss(row, data["anchors"], objective).total
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        times.append(time.perf_counter() - started)
        losses.append(loss.item())
    return {"step_seconds": statistics.median(times[warmup:]), "peak_rss_bytes": peak_rss_bytes(), "losses": losses}


def child(command: list[str]) -> dict:
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH-RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{command[1]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("BENCH-RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speculators-python", required=True, help="interpreter with speculators 0.9.0")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child-ours", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_ours:
        print("BENCH-RESULT " + json.dumps(ours(Path(args.child_ours), STEPS, WARMUP)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-spec-step-") as tmp:
        root = Path(tmp)
        done = subprocess.run([args.speculators_python, "-c", PREPARE, str(root)], capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ""})
        if done.returncode:
            raise SystemExit(f"preparing the world failed:\n{done.stderr[-3000:]}")
        import torch
        from safetensors.torch import load_file

        row = load_file(str(root / "row.safetensors"))
        rows = (row["anchors"][:, None] + torch.arange(8)[None, :]).reshape(-1)
        tokens = int(row["loss_mask"][rows].sum())
        runs: dict[str, list[dict]] = {"ours": [], "speculators": []}
        for _ in range(args.runs):
            runs["ours"].append(child([sys.executable, __file__, "--speculators-python", args.speculators_python,
                                       "--child-ours", str(root)]))
            runs["speculators"].append(child([args.speculators_python, "-c", LIBRARY, str(root), str(STEPS),
                                              str(WARMUP)]))
    first = [runs[name][0]["losses"][0] for name in runs]
    ratios = [a["step_seconds"] / b["step_seconds"] for a, b in zip(runs["ours"], runs["speculators"], strict=True)]
    print(f"identical speculators DSpark (2 GQA layers, block 8, 256 anchors, {tokens} supervised tokens a step); "
          f"load average {os.getloadavg()[0]:.1f}; first-step loss ours {first[0]:.6f} vs library {first[1]:.6f}")
    print("| trainer | step (s) | supervised tokens/s | peak RSS (MiB) |\n| --- | --- | --- | --- |")
    for name, label in (("ours", "dspark-hub"), ("speculators", "speculators 0.9.0")):
        step = statistics.median(r["step_seconds"] for r in runs[name])
        peak = statistics.median(r["peak_rss_bytes"] for r in runs[name])
        print(f"| {label} | {step:.3f} | {tokens / step:,.0f} | {peak / 2**20:,.0f} |")
    print(f"median ratio ours/speculators over {args.runs} alternating runs: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
