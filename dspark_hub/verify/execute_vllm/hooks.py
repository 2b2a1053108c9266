"""The hooks on vLLM's loader (observe only), the one stub on its config and the one CPU shim.

`install()` wraps, once per process: the weight iterator (`get_all_weights`: which tensors vLLM
reads, in order), model construction (`create_model`: every parameter filled with NaN, every
parameter's weight loader wrapped, `SHIM_CPU_KV_B_PROJ`), `default_weight_loader` and the wrapped
loaders (which tensor reached which parameter), `load_weights` (the NaN snapshot), the strict check
(`track_weights_loading`: what it raised for), the name mappers (`WeightsMapper.apply`: which rule
dropped a tensor), `STUB_V1_RUNNER_GATE` and `SHIM_NO_RETRY_SLEEP` (named in `stubs`), then does
what vLLM's CPU worker does before loading.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from dspark_hub.verify.execute_vllm.trace import INT_SENTINEL, STATE, current_trace, record_write, snapshot, tracing

if TYPE_CHECKING:
    import torch
    from vllm.config import ModelConfig, VllmConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.models.utils import WeightsMapper


def install() -> None:
    """Install every hook once per process (behaviour unchanged but for the stub and the shims)."""
    if STATE.installed:
        return
    _hook_weight_iterator()
    _hook_create_model()
    _hook_default_weight_loader()
    _hook_load_weights()
    _hook_strict_check()
    _hook_name_mappers()
    _stub_v1_runner_gate()
    _shim_no_retry_sleep()
    _worker_setup()
    STATE.installed = True


def _hook_weight_iterator() -> None:
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    get_all_weights = DefaultModelLoader.get_all_weights

    def hooked_get_all_weights(self: DefaultModelLoader, model_config: ModelConfig,
                               model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        t = current_trace()
        for name, tensor in get_all_weights(self, model_config, model):
            if t is not None and name in t.excluded:
                continue
            if t is not None:
                t.add_source(name, tensor)
            yield name, tensor
    DefaultModelLoader.get_all_weights = hooked_get_all_weights


def _hook_create_model() -> None:
    import torch
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    create_model = DefaultModelLoader.create_model

    def hooked_create_model(self: DefaultModelLoader, vllm_config: VllmConfig, model_config: ModelConfig,
                            prefix: str = "") -> torch.nn.Module:
        t = tracing()
        t.phase = "construct"
        model: torch.nn.Module = create_model(self, vllm_config, model_config, prefix)
        t.model = model
        with torch.no_grad():
            for pname, p in model.named_parameters():
                t.param_names[id(p)] = pname
                p.data.fill_(float("nan") if p.dtype.is_floating_point else INT_SENTINEL)
                loader = getattr(p, "weight_loader", None)
                if loader is not None and ("weight_loader" in p.__dict__ or hasattr(p, "_weight_loader")):
                    # weight_loader is vLLM's own attribute on its parameters, unknown to torch's types
                    p.weight_loader = _wrap_loader(loader, pname)   # type: ignore[attr-defined]
        shimmed = _shim_cpu_kv_b_proj(model)
        if shimmed:
            t.strict.setdefault("shimmed", []).extend(shimmed)
        t.phase = "load"
        return model
    DefaultModelLoader.create_model = hooked_create_model


def _shim_cpu_kv_b_proj(model: torch.nn.Module) -> list[str]:
    """SHIM_CPU_KV_B_PROJ on the K3 MLA modules of `model`; the modules it touched."""
    shimmed = []
    for mname, module in model.named_modules():
        if mname.endswith(".kv_b_proj"):
            parent = model.get_submodule(mname.rsplit(".", 1)[0])
            if type(parent).__module__ == "vllm.models.kimi_k3.nvidia.mla":
                module._cpu_skip_gemm_dispatch = True
                shimmed.append(mname)
    return shimmed


def _hook_default_weight_loader() -> None:
    from vllm.model_executor.models import utils as model_utils

    default_loader = model_utils.default_weight_loader

    def hooked_default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        t = tracing()
        src = record_write(t, t.param_names.get(id(param), "?"), loaded_weight, None)
        try:
            default_loader(param, loaded_weight)   # returns None
        except BaseException:
            t.failed_write = src or t.in_flight
            raise
    model_utils.default_weight_loader = hooked_default_weight_loader


def _wrap_loader(fn: Callable[..., Any], pname: str) -> Callable[..., Any]:

    def wrapped(param: torch.nn.Parameter, loaded_weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        t = tracing()
        shard = args[0] if args else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))
        src = record_write(t, pname, loaded_weight, shard)
        try:
            return fn(param, loaded_weight, *args, **kwargs)
        except BaseException:
            t.failed_write = src or t.in_flight
            raise
    wrapped.__wrapped__ = fn  # type: ignore[attr-defined]  # what inspect.unwrap follows; functions take attributes
    return wrapped


def _hook_load_weights() -> None:
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    load_weights = DefaultModelLoader.load_weights

    def hooked_load_weights(self: DefaultModelLoader, model: torch.nn.Module, model_config: ModelConfig) -> None:
        t = tracing()
        try:
            load_weights(self, model, model_config)   # returns None
        finally:
            t.snapshot = snapshot(model)
        t.phase = "post-process"
    DefaultModelLoader.load_weights = hooked_load_weights


def _hook_strict_check() -> None:
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    track = DefaultModelLoader.track_weights_loading

    def hooked_track(self: DefaultModelLoader, model: torch.nn.Module, loaded_weights: set[str] | None,
                     quantized: bool = False) -> None:
        t = tracing()
        t.phase = "strict-check"
        t.strict["ran"] = True
        everything = {name for name, _ in model.named_parameters()}
        try:
            track(self, model, loaded_weights, quantized)   # returns None
        except ValueError:
            # the check adds the exempt parameters to `loaded_weights` in place, then raises for the rest
            t.strict["raised_for"] = sorted(everything - set(loaded_weights or ()))
            raise
    DefaultModelLoader.track_weights_loading = hooked_track


def _hook_name_mappers() -> None:
    from vllm.model_executor.models.utils import WeightsMapper

    apply = WeightsMapper.apply
    depth = [0]

    def hooked_apply(self: WeightsMapper,
                     weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        t = current_trace()
        stage = depth[0]
        depth[0] += 1
        try:
            for name, data in weights:
                if t is not None and (src := t.source_of(data)) is not None:
                    if stage == 0:      # the outermost mapping: the tensor vLLM is working on now
                        t.in_flight = src
                    t.mapped.add(src)
                    if self._map_name_with_shard(name) is None:
                        t.dropped.setdefault(src, _drop_rule(self, name))
                yield from apply(self, [(name, data)])
        finally:
            depth[0] -= 1
    WeightsMapper.apply = hooked_apply


def _drop_rule(mapper: WeightsMapper, key: str) -> str:
    for pattern, new in mapper.orig_to_new_regex.items():
        if new is None and pattern.search(key):
            return f"regex {pattern.pattern!r} -> None"
    for sub, new in mapper.orig_to_new_substr.items():
        if sub in key and new is None:
            return f"substring {sub!r} -> None"
        if sub in key:
            key = key.replace(sub, new, 1)
    for pre, new in mapper.orig_to_new_prefix.items():
        if new is None and key.startswith(pre):
            return f"prefix {pre!r} -> None"
    return "a name rule maps it to nothing"


def _stub_v1_runner_gate() -> None:
    """STUB_V1_RUNNER_GATE."""
    from vllm.config import vllm as vllm_config_module

    gate = vllm_config_module.VllmConfig._get_v1_model_runner_unsupported_features

    def stub_v1_runner_gate(self: VllmConfig) -> list[str]:
        return [u for u in gate(self) if u != "dspark speculative decoding"]
    vllm_config_module.VllmConfig._get_v1_model_runner_unsupported_features = stub_v1_runner_gate


def _shim_no_retry_sleep() -> None:
    """SHIM_NO_RETRY_SLEEP."""
    from vllm.transformers_utils import repo_utils

    class _NoSleep:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            return None
    repo_utils.time = _NoSleep()


def _worker_setup() -> None:
    """What vLLM's CPU worker does before loading (`WORKER_SETUP`'s first entry)."""
    from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop
    _set_torch_accelerator_to_noop()
    # Every load calls gc.collect() (base_loader.py:92), which walks vLLM's whole import-time heap (~0.4 s);
    # freezing that heap leaves the collection to the objects a load creates. Timing only.
    gc.collect()
    gc.freeze()
