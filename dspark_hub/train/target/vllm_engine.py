"""The `vllm` target engine: rollouts from the real vLLM engine with hidden-state extraction.

vLLM runs in a child process (`dspark_hub.train.target.vllm_worker`, started on first use), for three
reasons measured on vLLM 0.32: its CPU worker patches torch for the whole process (thread count,
CUDA events, pinned memory), so the trainer must not share the process; on CPU there is no sleep
mode, so ending the process is the only complete release between on-policy rounds; and vLLM pins
torch and transformers versions the trainer need not share (`python=` runs it in another
virtualenv, e.g. the one `.ci/venv-vllm.sh` builds).

What it records, per sequence, is what the transformers engine records:

- taps: vLLM's aux layer id `k` is the residual stream after `k` decoder layers, so our
  `target_layer_ids` entry `l` (the OUTPUT of layer `l`) is id `format.taps.residual_index(l)` =
  `l + 1`. `vllm_layer_ids` is the one place the conversion happens; the target's last layer
  (id `num_hidden_layers`, before the final norm) is always added for the final state;
- final state: vLLM captures the last layer's output before the final norm, so the target's
  final norm, read from its weights (`Target.final_norm`), is applied here; the manifest
  says so;
- greedy continuations stop at the target's EOS ids (`Target.eos_ids`); a sequence that
  stops early is prefilled again so its stop token has a row, as in the transformers engine.

Memory between rounds: `release()` puts the engine to sleep (vLLM sleep mode, level 1) where the
platform has it (CUDA, ROCm, XPU), and otherwise stops the process; either way it says which.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dspark_hub.errors import EngineError, MissingDependencyError, UsageError, VllmInternalsMoved
from dspark_hub.format.taps import residual_index
from dspark_hub.train.target.engines import EngineOptions, Mode, Progress, option_param
from dspark_hub.train.target.generate import Draw, Prompt, Rollout, greedy_agreement, prefill_rollout
from dspark_hub.train.target.target import Target
from dspark_hub.vllm.availability import missing_vllm, vllm_importable
from dspark_hub.vllm.child import Child

#: The engine process's module (`python -m`; `vllm.child` launches it).
WORKER_MODULE = "dspark_hub.train.target.vllm_worker"
#: Prompts per engine request: vLLM batches within a request; progress is reported per request.
REQUEST_SIZE = 256


def vllm_layer_ids(target_layer_ids: list[int], num_hidden_layers: int) -> list[int]:
    """The aux layer ids vLLM extracts for a draft's taps: `residual_index(l)` for each, plus the last layer.

    Sorted and distinct, as vLLM needs (it sorts the tapped layers but sizes its buffer by the
    list's length, so a duplicate kills the engine). A draft tapping the last layer (`L - 1`)
    shares id `L` with the final state.
    """
    return sorted({residual_index(layer) for layer in target_layer_ids} | {num_hidden_layers})


def tap_columns(target_layer_ids: list[int], engine_ids: list[int]) -> list[int]:
    """Columns of an extracted `[T, n, H]` tensor holding the taps, in ascending tap order."""
    return [engine_ids.index(residual_index(layer)) for layer in sorted(target_layer_ids)]


def read_extracted(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An extraction file's tensors, read under a shared lock on its `.lock` companion when there is one.

    The connector holds that lock exclusively while it writes (upstream writes asynchronously),
    exactly as vLLM's `load_hidden_states` waits for it.
    """
    from safetensors.torch import load_file

    lock = Path(f"{path}.lock")
    if not lock.exists():
        return load_file(str(path))
    with open(lock, encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        return load_file(str(path))


class VllmEngine:
    """The vLLM engine in a child process (see the module docstring)."""

    name = "vllm"
    accepts = frozenset({"dtype", "tensor_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                         "gpu_memory_utilization", "kv_cache_memory_bytes", "python", "engine_args"})

    def __init__(self, target: Target, layer_ids: list[int], options: EngineOptions, *,
                 releasable: bool = False) -> None:
        require_vllm_options(options)
        if options.python is None and not vllm_importable():   # before any work is done
            raise missing_vllm("the vllm target engine")
        self.target = target
        self.layer_ids = sorted(layer_ids)
        self.options = options
        self.dtype = options.dtype or "auto"
        self.python = options.python or sys.executable
        self.releasable = releasable
        self.num_layers = int(target.text["num_hidden_layers"])
        self.engine_ids = vllm_layer_ids(self.layer_ids, self.num_layers)
        self.columns = tap_columns(self.layer_ids, self.engine_ids)
        self.last_column = self.engine_ids.index(self.num_layers)
        self.final_norm = target.final_norm()
        self.eos = target.eos_ids
        self._lm_head: Any = None
        self.child: Child | None = None
        self.ready: dict[str, Any] | None = None
        self.sleeping = False
        self.starts = 0
        self.peak_rss_bytes = 0
        self.failed = False

    # -- the process -----------------------------------------------------------------------

    def _engine_options(self) -> dict[str, Any]:
        given = {k: v for k, v in self.options.given().items() if k not in ("dtype", "python", "engine_args")}
        return {**given, **self.options.engine_args}

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.running

    def start(self) -> dict[str, Any]:
        """Start the engine process and the engine (a no-op when running; wakes it when asleep)."""
        if self.running:
            if self.sleeping:
                self._request({"op": "wake"})
                self.sleeping = False
            return self.ready or {}
        if self.options.python is None and not vllm_importable():
            raise missing_vllm("the vllm target engine")
        if self.child is None:
            self.child = Child(WORKER_MODULE, what="vllm engine", python=self.options.python, failure=EngineError)
        self.child.start()
        storage = self.child.workdir / "hidden_states"
        storage.mkdir(exist_ok=True)
        self.ready = self._request({"op": "start", "teacher": str(self.target.folder.resolve()),
                                    "engine_ids": self.engine_ids, "dtype": self.options.dtype,
                                    "options": self._engine_options(), "storage": str(storage),
                                    "sleep": self.releasable})
        self.starts += 1
        self.sleeping = False
        return self.ready

    def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request to the running engine; a refusal stops it, a failure keeps its log (`close`)."""
        assert self.child is not None
        try:
            reply = self.child.request(request)
        except (MissingDependencyError, UsageError, VllmInternalsMoved):
            self.stop()
            raise
        except EngineError:
            self.failed = True
            raise
        self.peak_rss_bytes = max(self.peak_rss_bytes, int(reply.get("peak_rss_bytes", 0)))
        return reply

    def stop(self) -> None:
        """End the engine process (the engine's memory goes with it)."""
        if self.child is not None:
            reply = self.child.stop()
            self.peak_rss_bytes = max(self.peak_rss_bytes, int((reply or {}).get("peak_rss_bytes", 0)))
        self.sleeping = False

    # -- the engine protocol -----------------------------------------------------------------

    @property
    def lm_head(self) -> Any:
        if self._lm_head is None:
            self._lm_head = self.target.lm_head().float()
        return self._lm_head

    def capture(self, sequences: list[list[int]], *, max_new_tokens: int = 0, ignore_eos: bool = False,
                stop_token_ids: list[int] | None = None, keep: str | os.PathLike[str] | None = None,
                first_index: int = 0) -> list[dict[str, Any]]:
        """Run the engine on token-id sequences (prefill only when `max_new_tokens` is 0).

        Args:
            sequences: token ids, one list per sequence.
            max_new_tokens: greedy continuation budget (0: record the sequences as they are).
            ignore_eos: never stop early.
            stop_token_ids: where a continuation stops (default: the target's EOS ids).
            keep: a folder to keep vLLM's extraction files in, as `hs_<first_index + i>.safetensors`
                (speculators' naming, the files its trainer reads); by default they are deleted.
            first_index: the number of the first kept file.

        Returns:
            Per sequence: `tokens` (`[T]`), `prompt_length`, `finish_reason`, `recaptured`, `aux`
            (`[T, taps * H]`, ascending taps, the engine's dtype), `last` (the last layer's
            pre-norm output) and `final` (after the target's final norm).
        """
        import torch

        self.start()
        stop = [] if ignore_eos else (self.eos if stop_token_ids is None else list(stop_token_ids))
        reply = self._request({"op": "capture", "sequences": sequences, "max_new_tokens": max_new_tokens,
                               "stop_token_ids": stop})
        if keep is not None:
            Path(keep).mkdir(parents=True, exist_ok=True)
        out = []
        for i, result in enumerate(reply["results"]):
            data = read_extracted(result["path"])
            Path(result["path"] + ".lock").unlink(missing_ok=True)
            if keep is None:
                Path(result["path"]).unlink(missing_ok=True)
            else:
                shutil.move(result["path"], Path(keep) / f"hs_{first_index + i}.safetensors")
            tokens = torch.tensor(result["tokens"], dtype=torch.long)
            if not torch.equal(data["token_ids"].long(), tokens):
                raise EngineError(f"vllm engine: the extraction file's token_ids differ from the sequence it ran "
                                  f"({int(data['token_ids'].shape[0])} vs {len(result['tokens'])} tokens)")
            hidden = data["hidden_states"]
            last = hidden[:, self.last_column]
            out.append({"tokens": tokens, "prompt_length": result["prompt_length"],
                        "finish_reason": result["finish_reason"], "recaptured": bool(result.get("recaptured")),
                        "aux": hidden[:, self.columns].flatten(1), "last": last, "final": self.final_norm(last)})
        return out

    def rollouts(self, prompts: list[Prompt], *, mode: Mode, max_new_tokens: int, ignore_eos: bool,
                 batch_size: int, progress: Progress | None = None,
                 states_dtype: str = "bfloat16", draw: Draw | None = None) -> Iterator[Rollout]:
        import torch

        if draw is not None:
            raise UsageError("the vllm rollouts engine continues greedily; sampled continuations are the "
                             "transformers engine's", param="engine")
        dtype = getattr(torch, states_dtype)

        for start in range(0, len(prompts), REQUEST_SIZE):
            group = prompts[start:start + REQUEST_SIZE]
            captures = self.capture([p.input_ids for p in group], max_new_tokens=max_new_tokens if mode == "generate"
                                    else 0, ignore_eos=ignore_eos)
            for prompt, capture in zip(group, captures, strict=True):
                if mode == "prefill":
                    yield prefill_rollout(prompt, capture["tokens"], capture["aux"], capture["final"], self.lm_head,
                                          states_dtype=dtype)
                    continue
                rollout = Rollout(prompt.index, prompt.dataset, capture["tokens"], capture["prompt_length"],
                                  capture["aux"].to(dtype), capture["final"].to(dtype))
                rollout.greedy_agreement = greedy_agreement(capture["final"], capture["tokens"], rollout.loss_mask,
                                                            self.lm_head)
                yield rollout
            if progress:
                progress(len(group))

    def describe(self) -> dict[str, Any]:
        ready = self.ready or {}
        return {"name": self.name, "vllm": ready.get("vllm"), "torch": ready.get("torch"),
                "platform": ready.get("platform"), "dtype": self.dtype, "model_dtype": ready.get("dtype"),
                "connector": ready.get("connector"), "vllm_layer_ids": self.engine_ids,
                "tap_columns": self.columns, "final_norm": self.final_norm.describe(),
                "eos_token_ids": self.eos, "options": ready.get("settings", self._engine_options()),
                "python": self.python, "version_warning": ready.get("version_warning")}

    def release(self) -> str:
        if not self.running:
            return "the vllm engine was not running"
        if self.ready and self.ready.get("sleep_mode"):
            self._request({"op": "sleep"})
            self.sleeping = True
            return ("put the vllm engine to sleep (level 1: weights in host memory, KV cache freed); "
                    "it wakes for the next round")
        platform = (self.ready or {}).get("platform", "this platform")
        self.stop()
        return (f"stopped the vllm engine process (vLLM has no sleep mode on {platform}); "
                "it restarts for the next round")

    def close(self) -> None:
        """Stop the engine and remove its scratch folder (kept, with the log, after a failure)."""
        self.stop()
        if self.child is not None and not self.failed:
            self.child.remove()
        self.child = None

    def __del__(self) -> None:   # a process left running would hold its memory
        with contextlib.suppress(Exception):
            self.stop()


def require_vllm_options(options: EngineOptions) -> None:
    """Refuse option values vLLM would only reject after a slow start."""
    for name in ("tensor_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                 "kv_cache_memory_bytes"):
        value = getattr(options, name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise UsageError(f"vllm engine option {name}: {value!r}; use a positive integer",
                             param=option_param(name))
    if options.gpu_memory_utilization is not None and not 0 < options.gpu_memory_utilization <= 1:
        raise UsageError(f"vllm engine option gpu_memory_utilization: {options.gpu_memory_utilization}; "
                         "use a fraction in (0, 1]", param=option_param("gpu_memory_utilization"))
