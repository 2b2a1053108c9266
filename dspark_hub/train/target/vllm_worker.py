"""The vLLM target engine's process: `python -m dspark_hub.train.target.vllm_worker`, in vLLM's interpreter.

`dspark_hub.train.target.vllm_engine.VllmEngine` starts it and talks to it in the JSON-lines protocol of
`dspark_hub.vllm.child` (one request per line on stdin, one reply per line on the process's original
stdout; vLLM's own printing goes to the log). Every reply carries `peak_rss_bytes`.

Requests (`op`):
  - `start`: build `vllm.LLM` configured for hidden-state extraction, exactly as speculators'
    `launch_vllm.py` configures a server (`speculative_config.method = extract_hidden_states`
    with `eagle_aux_hidden_state_layer_ids` = the vLLM ids, plus a hidden-states KV connector
    writing safetensors files under `storage`). Replies with the vLLM version, platform, dtype
    and whether sleep mode is on.
  - `capture`: greedy continuations (`max_new_tokens > 0`) or prefill only, for token-id
    sequences. Replies, per sequence, with the file vLLM's connector wrote (`hidden_states
    [T, n, H]` at the ids, ascending, and `token_ids [T]`), the tokens it covers, the prompt
    length and the finish reason. The parent reads and deletes the files.
  - `sleep` / `wake`: vLLM's sleep mode (level 1: weights to host memory, KV cache freed).
  - `exit`: shut the engine down and leave.

This module imports only the standard library and light modules of ours until `start`; then vLLM, and
our connector, which vLLM itself loads by module path. The vLLM version policy is `dspark_hub.vllm.pin`'s.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dspark_hub.errors import EngineError, MissingDependencyError, UsageError, VllmInternalsMoved
from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.jsonio import loads_strict
from dspark_hub.train.target.engines import peak_rss_bytes
from dspark_hub.vllm.availability import CPU_HEAD_SIZES, cpu_head_dim_problem, missing_vllm
from dspark_hub.vllm.child import serve
from dspark_hub.vllm.pin import judge_version

#: KV cache reserved on CPU unless the caller sizes it (vLLM's default takes 90% of system RAM there).
CPU_KV_CACHE_BYTES = 512 << 20

def _check_cpu_head_dim(target: Path) -> None:
    """Refuse a target vLLM's CPU attention cannot run, in one line (a `UsageError` about `target`)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = tuple(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):
        sizes = CPU_HEAD_SIZES
    config = loads_strict((target / CONFIG_NAME).read_text(encoding="utf-8"), path=CONFIG_NAME)
    problem = cpu_head_dim_problem(config, target, sizes)
    if problem:
        raise UsageError(problem, param="target")


class Worker:
    def __init__(self) -> None:
        self.llm: Any = None
        self.sleeping = False

    # -- start / stop ----------------------------------------------------------------------

    def start(self, request: dict[str, Any]) -> dict[str, Any]:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # in-process engine core: we drain it
        try:
            import vllm
            from vllm import LLM
        except ImportError:
            raise missing_vllm("the vllm target engine") from None
        version = getattr(vllm, "__version__", "?")
        verdict = judge_version(version)
        if verdict.refusal is not None:
            raise MissingDependencyError(verdict.refusal)
        from vllm.platforms import current_platform

        cpu = current_platform.is_cpu()
        target = Path(request["teacher"])
        if cpu:
            _check_cpu_head_dim(target)    # before the engine starts: vLLM would fail only after its slow start
        try:
            from dspark_hub.train.target.vllm_connector import connector_config
        except ImportError as exc:
            raise VllmInternalsMoved(str(exc)) from None
        options = dict(request.get("options") or {})
        defaults: dict[str, Any] = {"enforce_eager": cpu, "enable_prefix_caching": False, "seed": 0,
                                    "disable_log_stats": True, "generation_config": "vllm"}
        if cpu and "kv_cache_memory_bytes" not in options and "gpu_memory_utilization" not in options:
            defaults["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if not any((target / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            defaults["skip_tokenizer_init"] = True     # token ids in and out: no tokenizer needed
        sleep = bool(request.get("sleep")) and current_platform.is_sleep_mode_available()
        if sleep:
            defaults["enable_sleep_mode"] = True
        settings = {**defaults, **options}
        speculative_config = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                              "draft_model_config": {"hf_config": {
                                  "eagle_aux_hidden_state_layer_ids": list(request["engine_ids"])}}}
        kv_transfer_config = connector_config(request["storage"], cpu=cpu)
        started = time.perf_counter()
        self.llm = LLM(model=str(target), dtype=request.get("dtype") or "auto", speculative_config=speculative_config,
                       kv_transfer_config=kv_transfer_config, **settings)
        seconds = time.perf_counter() - started
        self._scheduler()   # fail now, not after the first request, if the engine core is not in this process
        dtype = str(self.llm.llm_engine.model_config.dtype).removeprefix("torch.")
        return {"vllm": version, "torch": _torch_version(), "platform": current_platform.device_type,
                "connector": kv_transfer_config["kv_connector"], "sleep_mode": sleep, "start_seconds": seconds,
                "dtype": dtype, "settings": _jsonable(settings), "pid": os.getpid(), "version_warning": verdict.warning,
                "peak_rss_bytes": peak_rss_bytes()}

    def exit(self) -> dict[str, Any]:
        if self.llm is not None:
            try:
                self.llm.llm_engine.engine_core.shutdown()
            finally:
                self.llm = None
                gc.collect()
        return {"peak_rss_bytes": peak_rss_bytes()}

    def sleep(self) -> dict[str, Any]:
        self.llm.sleep(level=1)
        self.sleeping = True
        return {}

    def wake(self) -> dict[str, Any]:
        self.llm.wake_up()
        self.sleeping = False
        return {}

    # -- capture ---------------------------------------------------------------------------

    def _scheduler(self) -> Any:
        core = getattr(self.llm.llm_engine, "engine_core", None)
        scheduler = getattr(getattr(core, "engine_core", None), "scheduler", None)
        if scheduler is None:
            raise EngineError("the vLLM engine core is not in this process "
                                        "(VLLM_ENABLE_V1_MULTIPROCESSING must be 0); cannot drain it")
        return scheduler

    def _drain(self, max_steps: int = 10_000) -> int:
        """Step until the scheduler holds nothing.

        `LLM.generate` returns once every request has finished; the connector extracts a finished
        request's states in the *next* step, which `generate` never runs. In-process it is driven here.
        """
        scheduler = self._scheduler()
        steps = 0
        while scheduler.has_requests():
            if steps >= max_steps:
                raise EngineError(f"the engine did not drain in {max_steps} steps")
            self.llm.llm_engine.step()
            steps += 1
        return steps

    def _run(self, sequences: list[list[int]], max_new_tokens: int, stop: list[int]) -> list[dict[str, Any]]:
        from vllm import SamplingParams

        generate = max_new_tokens > 0
        # max_new_tokens + 1: the file covers the prompt and the tokens fed back, i.e. all but the last sampled.
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens + 1 if generate else 1, ignore_eos=True,
                                stop_token_ids=list(stop) if generate and stop else None, detokenize=False,
                                extra_args={"kv_transfer_params": {"include_output_tokens": generate}})
        outputs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], params, use_tqdm=False)
        self._drain()
        results = []
        for sequence, output in zip(sequences, outputs, strict=True):
            path = (output.kv_transfer_params or {}).get("hidden_states_path")
            if path is None:
                raise EngineError(f"request {output.request_id}: no hidden_states_path in its "
                                            f"kv_transfer_params ({output.kv_transfer_params!r})")
            generated = [int(t) for t in output.outputs[0].token_ids]
            results.append({"path": path, "prompt_length": len(sequence), "generated": generated,
                            "finish_reason": output.outputs[0].finish_reason})
        return results

    def capture(self, request: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        sequences = [[int(t) for t in s] for s in request["sequences"]]
        max_new = int(request.get("max_new_tokens") or 0)
        results = self._run(sequences, max_new, list(request.get("stop_token_ids") or []))
        redo = []
        for i, result in enumerate(results):
            generated = result.pop("generated")
            if max_new <= 0:
                result["tokens"] = sequences[i]
                continue
            if len(generated) > max_new:          # the budget's extra token: never fed back, not kept
                result["tokens"] = sequences[i] + generated[:max_new]
                result["finish_reason"] = "length"
            else:                                 # stopped early: the stop token itself has no state yet
                result["tokens"] = sequences[i] + generated
                redo.append(i)
        if redo:
            # Prefill prompt + continuation (stop token included) so the stop token's row is
            # present, as in the transformers engine's rollouts.
            for i, again in zip(redo, self._run([results[i]["tokens"] for i in redo], 0, []), strict=True):
                _remove(results[i]["path"])
                results[i]["path"] = again["path"]
                results[i]["recaptured"] = True
        return {"results": results, "seconds": time.perf_counter() - started, "recaptured": len(redo),
                "peak_rss_bytes": peak_rss_bytes()}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "start":
            return self.start(request)
        if self.llm is None and op != "exit":
            raise EngineError(f"{op}: the engine is not started")
        handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "capture": self.capture, "sleep": lambda _r: self.sleep(), "wake": lambda _r: self.wake(),
            "exit": lambda _r: self.exit()}
        handler = handlers.get(op) if isinstance(op, str) else None
        if handler is None:
            raise EngineError(f"unknown op {op!r}")
        return handler(request)


def _remove(path: str) -> None:
    for name in (path, path + ".lock"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


def _torch_version() -> str:
    import torch

    return torch.__version__


def _jsonable(value: Any) -> Any:
    return loads_strict(json.dumps(value, default=str), path="engine reply")


def main() -> int:
    worker = Worker()
    serve(worker.handle)
    worker.exit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
