"""Target engines: what runs the target to produce a rollout's tokens and hidden states.

An engine turns prompts into `Rollout`s (`dspark_hub.train.data.rollouts`): the target's greedy
continuation (mode `generate`) or the given sequence as it is (mode `prefill`, for offline data),
with the target states at the draft's taps and the target's final-normed last hidden state.

Engines are registered by name in `ENGINES` (name -> `module:Class`, imported on first use), so a
command's choices come from the registry and no engine's dependencies are imported before it is
opened:

  - `transformers` (the default, and the oracle): the target as a transformers causal LM in this
    process; taps captured with forward hooks.
  - `vllm`: the real vLLM engine with hidden-state extraction, in a child process
    (`dspark_hub.train.target.vllm_engine`).

An engine holds memory between calls; `release()` frees it (for on-policy rounds that alternate
target rollouts with draft updates) and says how, and the next call brings the engine back.
"""

from __future__ import annotations

import gc
import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dspark_hub.errors import UsageError
from dspark_hub.train.target.generate import Draw, Prompt, Rollout, generate_rollouts, prefill_rollouts
from dspark_hub.train.target.target import Target, moved

if TYPE_CHECKING:
    from dspark_hub.train.target.target import CausalLM

# torch and transformers are imported inside the functions that run them: the CLI imports this
# module (the engine names and options) for `--help`.

#: engine name -> "module:Class" (imported when the engine is opened).
ENGINES: dict[str, str] = {
    "transformers": "dspark_hub.train.target.engines:TransformersEngine",
    "vllm": "dspark_hub.train.target.vllm_engine:VllmEngine",
}
DEFAULT_ENGINE = "transformers"
Mode = Literal["generate", "prefill"]
MODES: tuple[str, ...] = ("generate", "prefill")
Progress = Callable[[int], None]


@dataclass(frozen=True)
class EngineOptions:
    """How to run the target. `None` leaves a setting to the engine; each engine takes only its own.

    The vLLM ones are passed to `vllm.LLM` under the same names.
    """

    dtype: str | None = field(default=None, metadata={"help": "target dtype (float32, bfloat16, float16, auto)"})
    device: str | None = field(default=None, metadata={"help": "transformers: torch device of the target"})
    tensor_parallel_size: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    python: str | None = field(default=None, metadata={"help": "vllm: interpreter of the engine process"})
    engine_args: dict[str, Any] = field(default_factory=dict,
                                        metadata={"help": "vllm: further vllm.LLM keyword arguments"})

    def given(self) -> dict[str, Any]:
        """The options that were set (not None, not empty)."""
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}


class TargetEngine(Protocol):
    """What `make_rollouts` and on-policy training need from an engine."""

    name: str
    dtype: str     # the target dtype it runs (resolved default included): a rollouts setting

    def rollouts(self, prompts: list[Prompt], *, mode: Mode, max_new_tokens: int, ignore_eos: bool,
                 batch_size: int, progress: Progress | None = None,
                 states_dtype: str = "bfloat16", draw: Draw | None = None) -> Iterator[Rollout]:
        """One `Rollout` per prompt, in any order (each carries its prompt index), its states in `states_dtype`
        (bfloat16: what a rollouts folder stores; eval keeps float32). `draw`: sampled continuations
        (`generate.Draw`; the transformers engine only)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the manifest records about the engine (name, versions, dtype, options, ids)."""
        ...

    def release(self) -> str:
        """Free the engine's memory until its next use; returns one line saying how."""
        ...

    def close(self) -> None:
        """Free everything; the engine is not used again."""
        ...


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux `VmHWM`; `ru_maxrss` elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource  # Unix only: the fallback where /proc is absent

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def option_param(name: str) -> str:
    """The `param` of an error about the `EngineOptions` field `name`: `engine_options.<name>`."""
    return f"engine_options.{name}"


def engine_names() -> list[str]:
    """The registered engine names (CLI choices come from here)."""
    return sorted(ENGINES)


def open_engine(name: str, target: str | os.PathLike[str] | Target, layer_ids: list[int],
                options: EngineOptions | None = None, *, releasable: bool = False) -> TargetEngine:
    """Open the engine `name` on `target`, capturing the taps `layer_ids` (our convention).

    Nothing heavy starts here: an engine loads its target on first use.

    Args:
        name: a key of `ENGINES`.
        target: the target (`Target`), or its local folder.
        layer_ids: the draft's `target_layer_ids`.
        options: engine settings; an option the engine does not take is refused.
        releasable: the caller will `release()` between uses (the vLLM engine then asks for
            sleep mode where the platform has it).

    Raises:
        UsageError: unknown engine, or an option it does not take.
    """
    if name not in ENGINES:
        raise UsageError(f"target engine {name!r}: unknown; use one of {', '.join(engine_names())}")
    module, cls_name = ENGINES[name].split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    options = options or EngineOptions()
    foreign = sorted(set(options.given()) - set(cls.accepts))
    if foreign:
        raise UsageError(f"target engine {name!r} does not take {', '.join(foreign)}; "
                         f"it takes {', '.join(sorted(cls.accepts))}", param=option_param(foreign[0]))
    engine: TargetEngine = cls(Target.open(target), list(layer_ids), options, releasable=releasable)
    return engine


class TransformersEngine:
    """The target as a transformers causal LM in this process (forward hooks capture the taps)."""

    name = "transformers"
    accepts = frozenset({"dtype", "device"})

    def __init__(self, target: Target, layer_ids: list[int], options: EngineOptions, *,
                 releasable: bool = False) -> None:
        self.target = target
        self.layer_ids = layer_ids
        self.dtype = options.dtype or "float32"
        self.device = options.device or "cpu"
        self.model: CausalLM | None = None

    def _model(self) -> CausalLM:
        if self.model is None:
            self.model = moved(self.target.load(dtype=self.dtype), self.device)
        return self.model

    def rollouts(self, prompts: list[Prompt], *, mode: Mode, max_new_tokens: int, ignore_eos: bool,
                 batch_size: int, progress: Progress | None = None,
                 states_dtype: str = "bfloat16", draw: Draw | None = None) -> Iterator[Rollout]:
        import torch

        dtype = getattr(torch, states_dtype)
        if mode == "prefill":
            return prefill_rollouts(self._model(), prompts, self.layer_ids, batch_size=batch_size, progress=progress,
                                    states_dtype=dtype)
        return generate_rollouts(self._model(), prompts, self.layer_ids, max_new_tokens=max_new_tokens,
                                 batch_size=batch_size, ignore_eos=ignore_eos, progress=progress, states_dtype=dtype,
                                 draw=draw)

    def describe(self) -> dict[str, Any]:
        import torch
        import transformers

        return {"name": self.name, "transformers": transformers.__version__, "torch": torch.__version__,
                "dtype": self.dtype, "device": self.device,
                "taps": "forward hooks on the target_layer_ids decoder layers; final state = the model's own "
                        "final norm output"}

    def release(self) -> str:
        if self.model is None:
            return "the transformers target was not loaded"
        self.model = None
        gc.collect()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
        return "unloaded the transformers target (loaded again for the next round)"

    def close(self) -> None:
        self.release()
