"""Training speed: `finetune` throughput on the tiny config, and one draft training step vs DeepSeek-V3.

Usage: python bench/bench_train.py [--steps N] [--threads N]

1. Throughput: a random tiny Llama teacher (the tiny config's target: hidden 64, 6 layers,
   vocabulary 512), 64 rollouts of 16 + 112 tokens, then `dspark_hub.train.finetune` for N steps
   (batch 8, 64 anchors per sequence, block 7); prints continuation tokens per second.
2. Step time: forward + backward of the full draft training step (packed multi-anchor pass over
   T context rows and A x K block rows, Markov bias, lm_head, ce + tv + confidence losses) against
   a plain transformers `DeepseekV3ForCausalLM` with the same layers and dimensions (MLA, dense
   MLP, same vocabulary) doing causal-LM training on a sequence of T + A x K tokens (every row
   our step touches) and on one of A x K tokens (only the rows that run the full layers).
   Prints both ratios ours / peer (< 1 = ours faster).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dspark_hub.format import contract
from dspark_hub.train.finetuning import objective

STEP_CONFIG = {**contract.TINY_CONFIG, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
               "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 128, "kv_lora_rank": 64,
               "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "vocab_size": 8192,
               "draft_vocab_size": 8192, "target_hidden_size": 512, "target_num_hidden_layers": 12,
               "target_layer_ids": [1, 5, 9], "mask_token_id": 8189, "pad_token_id": 8191, "markov_rank": 64,
               "torch_dtype": "float32"}


def tiny_world(root: Path) -> None:
    """The tiny config's random Llama teacher, a tiny-profile draft and 64 rollouts of 16 + 112 tokens in `root`."""
    from transformers import LlamaForCausalLM

    from dspark_hub.ops.init import init_checkpoint
    from dspark_hub.train.data.rollouts import make_rollouts

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from teacher_factory import teacher_config

    torch.manual_seed(0)
    LlamaForCausalLM(teacher_config()).save_pretrained(str(root / "teacher"))
    init_checkpoint(root / "base", profile="tiny", embed_from=root / "teacher")
    rng = random.Random(0)
    (root / "p.jsonl").write_text("".join(json.dumps({"input_ids": [rng.randrange(10, 500) for _ in range(16)]})
                                          + "\n" for _ in range(64)))
    make_rollouts(root / "teacher", root / "p.jsonl", root / "base" / "config.json", root / "data",
                  max_new_tokens=112, ignore_eos=True, batch_size=64)


def throughput(steps: int) -> float:
    from dspark_hub.train import TrainConfig, finetune

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tiny_world(root)
        config = TrainConfig(base=str(root / "base"), out=str(root / "out"), data=str(root / "data"), steps=steps,
                             batch_size=8, max_anchors=64, target=str(root / "teacher"))
        result = finetune(config)
    print(f"finetune, tiny config: {result.steps} steps, {result.tokens:,} continuation tokens in "
          f"{result.seconds:.2f} s -> {result.tokens_per_second:,.0f} tokens/s (includes data reads and logging)")
    return result.tokens_per_second


def timed(fn, repeats: int = 5) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def draft_step_time(seq: int, anchors: int, block: int) -> float:
    from dspark_hub.modeling import K3DSparkConfig, K3DSparkModel
    from dspark_hub.train.finetuning.objective import Batch

    torch.manual_seed(0)
    cfg = STEP_CONFIG
    model = K3DSparkModel(K3DSparkConfig.from_dict(dict(cfg))).float().train()
    model.embed_tokens.weight.requires_grad_(False)
    lm_head = torch.randn(cfg["vocab_size"], cfg["hidden_size"]) * 0.02
    taps = len(cfg["target_layer_ids"]) * cfg["target_hidden_size"]
    ids = torch.randint(0, cfg["vocab_size"] - 8, (1, seq))
    mask = torch.ones(1, seq, dtype=torch.bool)
    picks = torch.randperm(seq - block - 1)[:anchors].sort().values[None]
    batch = Batch(ids, mask, torch.zeros(1, seq, dtype=torch.long), torch.randn(1, seq, taps),
                  torch.randn(1, seq, cfg["hidden_size"]), picks, torch.ones_like(picks, dtype=torch.bool))

    def step() -> None:
        out = model.teacher_forced(batch.context_states, batch.input_ids, batch.anchors, block_size=block,
                                   lm_head_weight=lm_head, doc_ids=batch.doc_ids, anchor_valid=batch.anchor_valid)
        sums = objective.loss_sums(out.logits, out.confidence_logits, out.labels, out.target_positions, batch,
                                   lm_head, terms=["ce", "tv"], gamma=4.0)
        objective.combine(sums, {"ce": 0.1, "tv": 0.9}, 1.0, sums.weight).backward()
        model.zero_grad(set_to_none=True)

    return timed(step)


def peer_step_time(tokens: int) -> float:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = STEP_CONFIG
    peer_config = DeepseekV3Config(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg["num_attention_heads"], q_lora_rank=cfg["q_lora_rank"],
        kv_lora_rank=cfg["kv_lora_rank"], qk_nope_head_dim=cfg["qk_nope_head_dim"],
        qk_rope_head_dim=cfg["qk_rope_head_dim"], v_head_dim=cfg["v_head_dim"], rms_norm_eps=cfg["rms_norm_eps"],
        max_position_embeddings=cfg["max_position_embeddings"], rope_parameters=dict(cfg["rope_parameters"]),
        rope_interleave=True, attention_bias=False, n_routed_experts=4,
        first_k_dense_replace=cfg["num_hidden_layers"], tie_word_embeddings=False)
    peer_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    peer = DeepseekV3ForCausalLM(peer_config).float().train()
    peer.model.embed_tokens.weight.requires_grad_(False)
    ids = torch.randint(0, cfg["vocab_size"], (1, tokens))

    def step() -> None:
        peer(input_ids=ids, labels=ids).loss.backward()
        peer.zero_grad(set_to_none=True)

    return timed(step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--anchors", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads")
    throughput(args.steps)
    block = 7
    ours = draft_step_time(args.seq, args.anchors, block)
    rows = args.anchors * block
    peer_all = peer_step_time(args.seq + rows)
    peer_block = peer_step_time(rows)
    print(f"draft step (T={args.seq} context rows, {args.anchors} anchors x K={block}), hidden "
          f"{STEP_CONFIG['hidden_size']}, {STEP_CONFIG['num_hidden_layers']} layers, "
          f"vocab {STEP_CONFIG['vocab_size']}:")
    print(f"  ours  forward+backward                        {ours * 1e3:8.1f} ms")
    print(f"  peer  DeepseekV3ForCausalLM, {args.seq + rows:4d} tokens         {peer_all * 1e3:8.1f} ms   "
          f"ratio ours/peer {ours / peer_all:.2f}")
    print(f"  peer  DeepseekV3ForCausalLM, {rows:4d} tokens         {peer_block * 1e3:8.1f} ms   "
          f"ratio ours/peer {ours / peer_block:.2f}")


if __name__ == "__main__":
    main()
