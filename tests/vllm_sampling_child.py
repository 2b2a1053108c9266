"""vLLM 0.32.0's own sampling kernels on given logits, in a fresh process of the vLLM interpreter.

Reads one JSON job on stdin, prints one JSON reply. Run by tests/test_sampled_acceptance_vllm.py;
a process of its own because Triton must be switched to its interpreter (no CUDA here) before vLLM's
kernels are imported, which other in-process vLLM tests may already have done.

Job: {"verify": [{"target_logits": [[V]] x (k + 1) (processed, as the rejection sampler receives them),
"draft_logits": [[V]] x k or null (null: one-hot drafts, vLLM's default greedy drafting), "drafts": [k],
"temperature": T, "requests": R}], "draw": {"logits": [V], "temperature": T, "requests": R},
"process": [{"logits": [V], "temperature", "min_p", "top_k", "top_p"}]}.
Reply: {"verify": [[[accepted, emitted token, count], ...]], "draw": [count per token],
"process": [[V] logits after vLLM's temperature, min-p, top-k and top-p]}.
"""

from __future__ import annotations

import json
import sys
import types
from collections import Counter
from typing import Any


def _interpreter() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    from dspark_hub.train.evaluation.vllm_eval_worker import install_interpreter_backend

    install_interpreter_backend()
    import vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils as kernels
    from vllm.triton_utils import tl
    # Triton's interpreter has no libdevice: `tldevice.log1p` (the probabilistic residual) returns None
    # there. log(1 + x) is the same function; only this process sees the substitute.
    kernels.tldevice = types.SimpleNamespace(log1p=lambda x: tl.log(1.0 + x))
    return "cpu"


def verify(case: dict[str, Any], device: str) -> list[list[int]]:
    import torch
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample

    target = torch.tensor(case["target_logits"], dtype=torch.float32, device=device)
    rows, requests = target.shape[0], case["requests"]
    k = rows - 1
    draft = None
    if case["draft_logits"] is not None:
        draft = torch.tensor(case["draft_logits"], dtype=torch.float32, device=device)[None].repeat(requests, 1, 1)
    sampled, num_sampled = rejection_sample(
        target.repeat(requests, 1).contiguous(), draft,
        torch.tensor([0, *case["drafts"]] * requests, dtype=torch.int64, device=device),  # row i + 1: draft i
        torch.arange(requests + 1, dtype=torch.int32, device=device) * rows,
        torch.arange(100, 100 + rows, dtype=torch.int64, device=device).repeat(requests),
        torch.arange(requests, dtype=torch.int32, device=device),
        torch.arange(requests, dtype=torch.int32, device=device).repeat_interleave(rows),
        torch.arange(rows, dtype=torch.int32, device=device).repeat(requests),
        torch.full((requests,), case["temperature"], dtype=torch.float32, device=device),
        torch.arange(requests, dtype=torch.int64, device=device) * 1_000_003 + 17, k)
    counts = Counter((int(n) - 1, int(row[int(n) - 1])) for row, n in zip(sampled.cpu(), num_sampled.cpu(),
                                                                           strict=True))
    return [[j, token, c] for (j, token), c in sorted(counts.items())]


def draw(job: dict[str, Any], device: str) -> list[int]:
    import torch
    from vllm.v1.worker.gpu.sample.gumbel import gumbel_sample

    requests = job["requests"]
    logits = torch.tensor(job["logits"], dtype=torch.float32, device=device)[None].repeat(requests, 1)
    tokens = gumbel_sample(logits, torch.arange(requests, dtype=torch.int32, device=device),
                           torch.full((requests,), job["temperature"], dtype=torch.float32, device=device),
                           torch.arange(requests, dtype=torch.int64, device=device) * 7919 + 5,
                           torch.full((requests,), 40, dtype=torch.int64, device=device),
                           apply_temperature=True, is_drafting=True)
    return torch.bincount(tokens.cpu(), minlength=logits.shape[1]).tolist()


def process(case: dict[str, Any], device: str) -> list[float]:
    """vLLM's `Sampler.apply_sampling_params` steps: its temperature and min-p kernels, then top-k/top-p
    through `apply_top_k_top_p_pytorch` (the Triton top-k/top-p kernel does not run in the interpreter)."""
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p, apply_top_k_top_p_pytorch
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature
    from vllm.v1.worker.gpu.sample.min_p import apply_min_p

    logits = torch.tensor([case["logits"]], dtype=torch.float32, device=device)
    index = torch.zeros(1, dtype=torch.int32, device=device)
    apply_temperature(logits, index, torch.tensor([case["temperature"]], dtype=torch.float32, device=device))
    apply_min_p(logits, index, torch.tensor([case["min_p"]], dtype=torch.float32, device=device))
    top_k = torch.tensor([case["top_k"]], dtype=torch.int64, device=device) if case["top_k"] else None
    top_p = torch.tensor([case["top_p"]], dtype=torch.float32, device=device) if case["top_p"] < 1 else None
    truncate = apply_top_k_top_p if device == "cuda" else apply_top_k_top_p_pytorch
    return truncate(logits, top_k, top_p)[0].tolist()


def main() -> None:
    job = json.load(sys.stdin)
    device = _interpreter()
    reply = {"verify": [verify(case, device) for case in job["verify"]], "draw": draw(job["draw"], device),
             "process": [process(case, device) for case in job["process"]]}
    json.dump(reply, sys.stdout)


if __name__ == "__main__":
    main()
