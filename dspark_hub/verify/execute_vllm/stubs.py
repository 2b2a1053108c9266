"""What stands in for the parts of a deployment the loader execution has not got (`STUBS`, `SHIMS`).

Stubs exist only where no target model or GPU exists; the one CPU shim is `SHIMS`. Both, and what
vLLM's own CPU worker does before loading (`WORKER_SETUP`), are named in every result.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.registry import FORMATS
from dspark_hub.verify.execute_vllm.trace import STATE

if TYPE_CHECKING:
    import torch

STUBS: dict[str, str] = {
    "STUB_TARGET_CONFIG": "a config.json-only Qwen3 target (no weights, no tokenizer) so ModelConfig and "
                          "SpeculativeConfig have a target_model_config; it carries what the draft reads from the "
                          "target: its layer count (the draft's start_layer_id, dspark_mla.py:465, "
                          "qwen3_dspark.py:242), hidden size and vocabulary (qwen3_dspark.py:258)",
    "STUB_TARGET_MODEL": "an nn.Module with model.embed_tokens and lm_head, given to load_dspark_model, which "
                         "aliases the target's embedding and lm_head into the draft after loading "
                         "(v1/worker/gpu/spec_decode/dspark/utils.py:124-149); its weights are never read",
    "STUB_V1_RUNNER_GATE": "drops the one entry 'dspark speculative decoding' from VllmConfig."
                           "_get_v1_model_runner_unsupported_features: DSpark needs Model Runner V2, V2 needs "
                           "Triton, the CPU build has none (config/vllm.py:723-727, 2976-2979, 3197-3202); "
                           "without it no VllmConfig with a dspark speculative config can be built on CPU",
}
SHIMS: dict[str, str] = {
    "SHIM_NO_RETRY_SLEEP": "vLLM retries a config parse that raised after sleeping 2 s (transformers_utils/"
                           "repo_utils.py:99-131, meant for transient Hub errors); the retry re-reads the same local "
                           "file and raises the same error, so the engine skips the sleep (timing only)",
    "SHIM_CPU_KV_B_PROJ": "sets kv_b_proj._cpu_skip_gemm_dispatch = True on the K3 MLA modules after "
                          "construction, as vLLM's generic MLAAttention does (layers/attention/mla_attention.py:"
                          "603-606) and the K3 MultiHeadLatentAttention (models/kimi_k3/nvidia/mla.py) does not; "
                          "without it the CPU linear post-processing drops kv_b_proj.weight (layers/linear.py:"
                          "206-216) and K3's process_weights_after_loading fails (mla_attention.py:417). It acts "
                          "after the strict check, so no verdict depends on it",
}
#: Not stubs: what vLLM's own CPU worker does before loading (named in every result too).
WORKER_SETUP = ("vllm.v1.worker.cpu_model_runner._set_torch_accelerator_to_noop() (cpu_model_runner.py:178-188; "
                "otherwise base_loader.py:93 raises on CPU-only torch)",
                "a one-process gloo group and model-parallel groups of size 1, as a worker creates")



def stub_target_config(config: Mapping[str, Any], fmt: str, workdir: Path) -> tuple[Path, dict[str, Any]]:
    """STUB_TARGET_CONFIG: a config.json-only Qwen3 target whose numbers match the draft's (folder, config)."""
    keys = FORMATS[fmt].pairing_keys(config)
    layers = int(keys.target_layers or max(keys.taps or [0]) + 3)
    hidden = int(keys.tap_width or config.get("hidden_size") or 64)
    vocab = int(keys.vocab_size or 512)
    heads = 4
    target = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": hidden,
              "intermediate_size": 2 * hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": heads, "head_dim": max(16, hidden // heads), "vocab_size": vocab,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
              "tie_word_embeddings": False}
    folder = workdir / f"stub-target-{layers}-{hidden}-{vocab}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_NAME).write_text(json.dumps(target))
    return folder, target


def stub_target_model(vocab: int, hidden: int) -> torch.nn.Module:
    """STUB_TARGET_MODEL."""
    import torch.nn as nn
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    class _Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = VocabParallelEmbedding(vocab, hidden)

    class StubTarget(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = _Inner()
            self.lm_head = ParallelLMHead(vocab, hidden)

    return StubTarget()


def distributed() -> None:
    """One gloo process group and model-parallel groups of size 1 (once per process), as a worker has."""
    if STATE.distributed:
        return
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment

    with tempfile.TemporaryDirectory(prefix="dspark-gloo-") as scratch:   # the rendezvous file of a 1-rank group
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"file://{scratch}/init", backend="gloo")
        ensure_model_parallel_initialized(1, 1)
    STATE.distributed = True
