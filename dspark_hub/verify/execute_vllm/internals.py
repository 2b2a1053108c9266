"""The vLLM internals the loader execution hooks or calls, checked before anything runs (`check_internals`)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from dspark_hub.errors import VllmInternalsMoved, VllmNotAvailable
from dspark_hub.vllm import availability
from dspark_hub.vllm.availability import INSTALL_HINT
from dspark_hub.vllm.pin import PINNED_VERSION, judge_version

#: The vLLM internals the engine hooks or calls: module -> attributes. Checked before anything runs.
INTERNALS: dict[str, tuple[str, ...]] = {
    "vllm.model_executor.model_loader.default_loader": ("DefaultModelLoader",),
    "vllm.model_executor.models.utils": ("AutoWeightsLoader", "WeightsMapper", "default_weight_loader"),
    "vllm.config.vllm": ("VllmConfig",),
    "vllm.config": ("ModelConfig", "SpeculativeConfig", "ParallelConfig", "DeviceConfig", "LoadConfig",
                    "set_current_vllm_config"),
    "vllm.v1.worker.gpu.spec_decode.dspark.utils": ("load_dspark_model",),
    "vllm.v1.worker.cpu_model_runner": ("_set_torch_accelerator_to_noop",),
    "vllm.distributed.parallel_state": ("init_distributed_environment", "ensure_model_parallel_initialized"),
    "vllm.model_executor.layers.linear": ("MergedColumnParallelLinear", "QKVParallelLinear"),
    "vllm.model_executor.layers.vocab_parallel_embedding": ("ParallelLMHead", "VocabParallelEmbedding"),
    "vllm.models.kimi_k3.nvidia.dspark_mla": ("K3DSparkForCausalLM",),
    "vllm.model_executor.models.qwen3_dspark": ("Qwen3DSparkForCausalLM",),
}
_METHODS = {"DefaultModelLoader": ("get_all_weights", "create_model", "load_weights", "track_weights_loading"),
            "AutoWeightsLoader": ("_can_ignore_unexpected",), "WeightsMapper": ("apply",),
            "VllmConfig": ("_get_v1_model_runner_unsupported_features",)}


def require_vllm() -> None:
    """Refuse, in one line, a Python where vLLM cannot be imported (does not import it).

    Raises:
        VllmNotAvailable: vLLM is not importable here.
    """
    if not availability.vllm_importable():
        raise VllmNotAvailable(f"vLLM is not importable in {sys.executable}; {INSTALL_HINT}", param="execute")


def check_internals() -> str:
    """Import vLLM, apply the version policy (`vllm.pin`) and check every internal the engine hooks; vLLM's version.

    Raises:
        VllmNotAvailable: vLLM cannot be imported, or the version policy refuses it.
        VllmInternalsMoved: an internal is missing (the message names each one and both versions).
    """
    require_vllm()
    try:
        import vllm
    except Exception as exc:  # a broken install (e.g. torchvision ops that do not register): say so
        raise VllmNotAvailable(f"'import vllm' fails in {sys.executable}: {type(exc).__name__}: {exc}; "
                               f"{INSTALL_HINT}", param="execute") from exc
    version = str(getattr(vllm, "__version__", "unknown"))
    refusal = judge_version(version).refusal
    if refusal is not None:
        raise VllmNotAvailable(refusal, param="execute")
    moved = _moved_internals()
    if moved:
        raise VllmInternalsMoved(f"vLLM {version} lacks what the execution engine hooks (built against vLLM "
                                 f"{PINNED_VERSION}): {', '.join(moved)}; the rules still judge the draft "
                                 "without executing vLLM")
    return version


def _moved_internals() -> list[str]:
    """Every `INTERNALS` module or name, and `_METHODS` method, the installed vLLM lacks."""
    moved: list[str] = []
    found: dict[str, Any] = {}
    for module, names in INTERNALS.items():
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # any import failure means the layout moved
            moved.append(f"{module} ({type(exc).__name__}: {exc})")
            continue
        for name in names:
            if not hasattr(mod, name):
                moved.append(f"{module}.{name}")
            else:
                found[name] = getattr(mod, name)
    for cls_name, methods in _METHODS.items():
        cls = found.get(cls_name)
        moved += [f"{cls_name}.{m}" for m in methods if cls is not None and not hasattr(cls, m)]
    return moved
