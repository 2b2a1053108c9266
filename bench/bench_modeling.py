"""k3_dspark modeling benchmarks: low-memory loading, and one layer vs transformers' DeepSeek-V3 layer.

Usage:
  python bench/bench_modeling.py load [CHECKPOINT_DIR] [--make-zeros]
  python bench/bench_modeling.py layer [--profile kimi-k3|tiny] [--seq 64] [--repeat 3] [--dtype float32]

(a) `load`: peak RSS of a fresh process running `AutoModel.from_pretrained(dir, dtype=bfloat16)`
    (mmap-backed) vs the `model.safetensors` size. Target: <= 1.25x. The folder normally comes from
    `python -m dspark_hub init DIR --profile kimi-k3`; `--make-zeros` writes a sparse all-zero
    reference-shaped checkpoint instead (fine for load timing and memory) if the folder has none.
(b) `layer`: forward+backward wall time of one draft decoder layer vs `DeepseekV3DecoderLayer`
    (dense MLP, same dimensions, same weights, same input and the same non-causal mask), best of
    `--repeat` alternating runs. Target: ours/peer <= 1.1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LOAD_CHILD = """
import json, resource, sys, time, torch
import dspark_hub.modeling  # registers k3_dspark
from transformers import AutoModel
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
model, info = AutoModel.from_pretrained(sys.argv[1], dtype=torch.bfloat16, output_loading_info=True)
seconds = time.perf_counter() - start
peak_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
# Loading may leave the weights memory-mapped: read every byte so they are resident, then measure again.
with torch.no_grad():
    for p in model.parameters():
        for piece in p.detach().view(-1).split(1 << 24):
            piece.sum()
print(json.dumps({"seconds": seconds, "baseline": baseline, "peak": peak_load,
                  "peak_touched": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "params": sum(p.numel() for p in model.parameters()),
                  "missing": len(info["missing_keys"]), "unexpected": len(info["unexpected_keys"])}))
"""


def write_zero_checkpoint(folder: Path) -> None:
    """Reference-shaped checkpoint whose tensor data are zeros: header, then a sparse tail."""
    from dspark_hub.format import contract

    folder.mkdir(parents=True, exist_ok=True)
    header = contract.expected_header(contract.REFERENCE_CONFIG)
    tmp = folder / ".model.safetensors.tmp"
    with open(tmp, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        f.truncate(contract.expected_file_size(contract.REFERENCE_CONFIG))
    os.replace(tmp, folder / "model.safetensors")
    (folder / "config.json").write_bytes(contract.reference_config_bytes())


def bench_load(folder: Path, make_zeros: bool) -> None:
    weights = folder / "model.safetensors"
    if not weights.exists():
        if not make_zeros:
            sys.exit(f"{weights}: not found; run 'python -m dspark_hub init {folder} --profile kimi-k3' "
                     "or pass --make-zeros")
        write_zero_checkpoint(folder)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", LOAD_CHILD, str(folder)], env=env, capture_output=True, text=True,
                         check=True)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    size = weights.stat().st_size
    mib = 1 << 20
    print(f"checkpoint: {weights} ({size:,} bytes, {result['params']:,} params, "
          f"missing {result['missing']}, unexpected {result['unexpected']})")
    print(f"from_pretrained (bf16)      {result['seconds']:7.2f} s")
    print(f"import baseline RSS         {result['baseline'] / mib:9.1f} MiB")
    print(f"peak RSS during load        {result['peak'] / mib:9.1f} MiB")
    print(f"peak RSS / file size        {result['peak'] / size:9.3f}   (target <= 1.25)")
    print(f"peak RSS after reading every weight {result['peak_touched'] / mib:9.1f} MiB = "
          f"{result['peak_touched'] / size:.3f} x file size (target <= 1.25; weights fully resident)")


def _layers(profile: str, dtype):
    import torch
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    from dspark_hub.format import contract
    from dspark_hub.modeling import K3DSparkConfig
    from dspark_hub.modeling.modeling_k3_dspark import K3DSparkDecoderLayer, K3DSparkRotary

    config = K3DSparkConfig.from_dict(contract.profile_config(profile))
    ds = DeepseekV3Config(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=1, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads, q_lora_rank=config.q_lora_rank,
        kv_lora_rank=config.kv_lora_rank, qk_nope_head_dim=config.qk_nope_head_dim,
        qk_rope_head_dim=config.qk_rope_head_dim, v_head_dim=config.v_head_dim, rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings, rope_parameters=dict(config.rope_parameters),
        rope_interleave=True, attention_bias=False, first_k_dense_replace=1, n_routed_experts=8,
    )
    ds._attn_implementation = "sdpa"
    torch.manual_seed(0)
    ours = K3DSparkDecoderLayer(config, 0).to(dtype)
    with torch.no_grad():
        for param in ours.parameters():
            param.normal_(0, 0.02) if param.dim() > 1 else param.fill_(1.0)
    peer = DeepseekV3DecoderLayer(ds, layer_idx=0).to(dtype)
    peer.load_state_dict(ours.state_dict())
    return config, ds, ours, peer, K3DSparkRotary(config)


def bench_layer(profile: str, seq: int, repeat: int, dtype_name: str) -> None:
    import torch
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    dtype = getattr(torch, dtype_name)
    config, ds, ours, peer, rotary = _layers(profile, dtype)
    hidden = torch.randn(1, seq, config.hidden_size, dtype=dtype)
    positions = torch.arange(seq)[None]
    cos, sin = rotary(positions)
    peer_cos_sin = DeepseekV3RotaryEmbedding(ds)(hidden, positions)
    mask = torch.ones(1, 1, seq, seq, dtype=torch.bool)  # non-causal, identical for both

    def run_ours():
        x = hidden.clone().requires_grad_(True)
        ours(x, None, None, cos, sin, None, None, mask).float().pow(2).mean().backward()

    def run_peer():
        x = hidden.clone().requires_grad_(True)
        peer(x, attention_mask=mask, position_embeddings=peer_cos_sin).float().pow(2).mean().backward()

    # HF hard-codes eps 1e-6 for the latent norms; use the config's so the outputs are comparable.
    peer.self_attn.q_a_layernorm.variance_epsilon = peer.self_attn.kv_a_layernorm.variance_epsilon = config.rms_norm_eps
    with torch.no_grad():
        agree = (ours(hidden, None, None, cos, sin, None, None, mask)
                 - peer(hidden, attention_mask=mask, position_embeddings=peer_cos_sin)).abs().max().item()
    timings: dict[str, list[float]] = {"ours": [], "peer": []}
    run_ours(), run_peer()  # warm-up
    for _ in range(repeat):
        for name, fn in (("ours", run_ours), ("peer", run_peer)):
            ours.zero_grad(set_to_none=True), peer.zero_grad(set_to_none=True)
            start = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - start)
    best_ours, best_peer = min(timings["ours"]), min(timings["peer"])
    params = sum(p.numel() for p in ours.parameters())
    print(f"one layer, profile {profile} ({params:,} params), {dtype_name}, seq {seq}, threads "
          f"{torch.get_num_threads()}; max |ours - peer| forward = {agree:.2e}")
    runs = {name: ", ".join(f"{t:.3f}" for t in times) for name, times in timings.items()}
    print(f"k3_dspark layer fwd+bwd               {best_ours:8.3f} s  (runs: {runs['ours']})")
    print(f"DeepseekV3DecoderLayer fwd+bwd (peer) {best_peer:8.3f} s  (runs: {runs['peer']})")
    print(f"ratio ours/peer: {best_ours / best_peer:.3f}  (target <= 1.1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench", required=True)
    load = sub.add_parser("load")
    load.add_argument("folder", nargs="?", type=Path, default=Path("/work/bench-data/kimi-k3"))
    load.add_argument("--make-zeros", action="store_true")
    layer = sub.add_parser("layer")
    layer.add_argument("--profile", default="kimi-k3", choices=["kimi-k3", "tiny"])
    layer.add_argument("--seq", type=int, default=64)
    layer.add_argument("--repeat", type=int, default=3)
    layer.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    if args.bench == "load":
        bench_load(args.folder, args.make_zeros)
    else:
        bench_layer(args.profile, args.seq, args.repeat, args.dtype)


if __name__ == "__main__":
    main()
