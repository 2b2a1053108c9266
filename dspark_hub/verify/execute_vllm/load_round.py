"""One load (a round): vLLM's config for the draft, then the loader the DSpark proposer runs, traced.

`one_round` returns the round's `Trace` and its outcome: ``starts`` (with what `load_dspark_model`
replaced after loading), ``refused at config parse`` or ``refused at load`` (with vLLM's message and
its raise site), ``raised`` (naming the tensor being loaded: the next round excludes it), ``fails at
the strict check`` or ``fails after loading``.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_hub.verify.execute_vllm.stubs import distributed, stub_target_config, stub_target_model
from dspark_hub.verify.execute_vllm.trace import STATE, Trace

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig


def one_round(folder: Path, fmt: str, config: Mapping[str, Any], excluded: set[str], workdir: Path,
              num_speculative_tokens: int) -> tuple[Trace, dict[str, Any]]:
    """Load `folder` once without the tensors in `excluded` (see the module docstring)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.spec_decode.dspark.utils import load_dspark_model

    t = Trace(excluded)
    STATE.trace = t
    outcome: dict[str, Any] = {}
    target_dir, target_cfg = stub_target_config(config, fmt, workdir)
    try:
        vc = _vllm_config(folder, target_dir, num_speculative_tokens)
    except Exception as exc:  # vLLM refusing the config is a verdict, not an engine error
        outcome.update(outcome="refused at config parse", refusal=_config_refusal(exc, folder))
        return t, outcome
    with set_current_vllm_config(vc):
        distributed()
        stub = stub_target_model(int(target_cfg["vocab_size"]), int(target_cfg["hidden_size"]))
        try:
            model = load_dspark_model(stub, vc)
        except Exception as exc:
            outcome.update(_load_failure(t, exc))
            if t.model is not None:
                outcome["model_class"] = type(t.model).__name__
            return t, outcome
    outcome.update(outcome="starts", model_class=type(model).__name__, replaced=_replaced(model, stub))
    return t, outcome


def _vllm_config(folder: Path, target_dir: Path, num_speculative_tokens: int) -> VllmConfig:
    """The `VllmConfig` of the stub target served with the draft `folder` (raises what vLLM's parse raises)."""
    from vllm.config import DeviceConfig, LoadConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig

    target = ModelConfig(model=str(target_dir), skip_tokenizer_init=True, dtype="bfloat16", trust_remote_code=False)
    parallel = ParallelConfig()
    spec = SpeculativeConfig(method="dspark", model=str(folder), num_speculative_tokens=num_speculative_tokens,
                             target_model_config=target, target_parallel_config=parallel)
    return VllmConfig(model_config=target, speculative_config=spec, parallel_config=parallel,
                      device_config=DeviceConfig("cpu"), load_config=LoadConfig())


def _replaced(model: torch.nn.Module, stub: torch.nn.Module) -> dict[str, str]:
    """Draft parameters `load_dspark_model` replaced after loading (so their load state does not matter)."""
    replaced: dict[str, str] = {}
    inner = getattr(model, "model", None)
    if inner is not None and getattr(inner, "embed_tokens", None) is stub.get_submodule("model.embed_tokens"):
        replaced["model.embed_tokens.weight"] = "the target's embed_tokens (aliased by load_dspark_model)"
    if getattr(model, "lm_head", None) is stub.get_submodule("lm_head"):
        replaced["lm_head.weight"] = "the target's lm_head (aliased by load_dspark_model)"
    if inner is not None and hasattr(inner, "mask_embedding") and not getattr(inner, "has_separate_mask_embedding",
                                                                              True):
        replaced["model.mask_embedding"] = "an unused placeholder (has_separate_mask_embedding is False)"
    return replaced


def _config_refusal(exc: BaseException, folder: Path) -> dict[str, str]:
    """The message vLLM's config parser raised (pydantic wraps it; re-parse to find the raise site)."""
    message = str(exc)
    site = ""
    try:
        from vllm.transformers_utils.config import get_config

        get_config(str(folder), trust_remote_code=False)
    except Exception as inner:
        message = str(inner)
        site = _raise_site(inner)
    else:
        marker = "Value error, "
        if marker in message:
            message = message.split(marker, 1)[1].split(" [type=", 1)[0]
    return {"stage": "config", "type": type(exc).__name__, "message": message.strip(), "site": site}


def _load_failure(t: Trace, exc: BaseException) -> dict[str, Any]:
    culprit = t.failed_write or (t.in_flight if t.phase == "load" else None)
    message = f"{type(exc).__name__}: {exc}"
    if t.phase == "strict-check":
        return {"outcome": "fails at the strict check", "error": message[:2000], "site": _raise_site(exc)}
    if t.phase == "post-process":
        return {"outcome": "fails after loading", "error": message[:2000], "site": _raise_site(exc)}
    if culprit is None:
        return {"outcome": "refused at load", "refusal": {"stage": "load", "type": type(exc).__name__,
                                                          "message": str(exc).strip(), "site": _raise_site(exc)}}
    return {"outcome": "raised", "culprit": culprit, "error": message[:2000], "site": _raise_site(exc)}


def _raise_site(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "/vllm/" in frame.filename:
            return "vllm/" + frame.filename.split("/vllm/", 1)[1] + f":{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""

