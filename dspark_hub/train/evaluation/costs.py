"""The costs of `speedup`, timed on this machine for the given target and draft (`eval --costs measure`).

At one context length `L` (the middle of the median rollout's continuation), with the target's KV cache
holding the `L` tokens before it:

- a target decode step: the target's forward over 1 token;
- a verify pass at k: the target's forward over `k + 1` tokens (the drafts and the token after them);
- a draft step at k: the draft's block pass with the anchor at `L` (its k rows over the `L` context rows,
  the vocabulary projection and the Markov chain: `drafters.sweep_drafter_for`'s `propose_many`); the
  context rows' own projection is done once beforehand, as a serving engine keeps it.

Each is timed `repeats` times in alternating rounds (one of every operation a round, so load that comes and
goes hits all of them alike) after one warm-up round; the costs are median times divided by the decode
step's median. Every target pass starts from a copy of the `L` tokens' cache, made outside the timing.
Float32 on the device the target sits on (the CPU: `target.load_target`), in this process's torch threads.
"""

from __future__ import annotations

import copy
import inspect
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dspark_hub.errors import UsageError
from dspark_hub.train.evaluation.acceptance import ProposeMany
from dspark_hub.train.evaluation.speedup import Costs

if TYPE_CHECKING:
    from dspark_hub.train.evaluation.acceptance import SweepDrafter
    from dspark_hub.train.target.generate import Rollout
    from dspark_hub.train.target.target import CausalLM

#: Alternating rounds timed (after one warm-up round).
REPEATS = 7


def context_rollout(rollouts: Sequence[Rollout], longest_k: int) -> tuple[Rollout, int]:
    """The median-length rollout and the context length `L` timed on it: the middle of its continuation, with
    `longest_k + 1` tokens after it.

    Raises:
        UsageError: no rollout is long enough for a block of `longest_k` after its prompt.
    """
    fit = [r for r in rollouts if len(r.input_ids) >= r.prompt_length + longest_k + 2]
    if not fit:
        raise UsageError(f"no rollout continues {longest_k + 2} tokens past its prompt; costs are timed with a "
                         "block of the largest k after the context", param="costs")
    rollout = sorted(fit, key=lambda r: len(r.input_ids))[len(fit) // 2]
    continuation = len(rollout.input_ids) - rollout.prompt_length
    return rollout, min(rollout.prompt_length + continuation // 2, len(rollout.input_ids) - longest_k - 2)


#: An operation timed: (prepare it, untimed; run it, timed).
Operation = tuple[Callable[[], object], Callable[[], object]]


def _median_seconds(operations: dict[str, Operation], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in operations}
    for round_ in range(repeats + 1):
        for name, (prepare, run) in operations.items():
            prepare()
            start = time.perf_counter()
            run()
            if round_:                       # round 0 warms up
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _draft_step(propose_many: ProposeMany, context: int) -> Operation:
    return (lambda: None), (lambda: propose_many([(0, context)]))


def _cache_keyword(model: Any) -> str:
    """The forward's keyword for the KV cache: `cache` (transformers 5.25 on), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def measure_costs(model: CausalLM, rollouts: Sequence[Rollout], drafter: SweepDrafter, ks: Sequence[int], *,
                  repeats: int = REPEATS) -> Costs:
    """Draft-step and verify-pass costs per k, in target decode steps, timed here (module docstring).

    Args:
        model: the target, loaded (`target.load_target`, float32, on the CPU).
        rollouts: the eval's; the median-length one is timed on (`context_rollout`).
        drafter: the draft's (`drafters.sweep_drafter_for`).
        ks: the k to time a draft step and a verify pass at.
        repeats: alternating rounds timed.

    Raises:
        UsageError: no rollout long enough (`context_rollout`).
    """
    import torch  # heavy: only a measurement of costs pays for it

    rollout, context = context_rollout(rollouts, max(ks))
    ids = rollout.input_ids[None]
    proposers = drafter([rollout], list(ks))
    keyword = _cache_keyword(model)
    with torch.no_grad():
        prefilled = model(ids[:, :context], use_cache=True)
        cache = getattr(prefilled, keyword)

        def target_pass(tokens: int) -> Operation:
            state: dict[str, Any] = {}

            def prepare() -> None:       # each pass starts from the L tokens' cache, copied outside the timing
                state["cache"] = copy.deepcopy(cache)

            def run() -> None:
                model(ids[:, context:context + tokens], use_cache=True, **{keyword: state["cache"]})

            return prepare, run

        operations: dict[str, Operation] = {"decode": target_pass(1)}
        for k in ks:
            operations[f"verify {k}"] = target_pass(k + 1)
            operations[f"draft {k}"] = _draft_step(proposers[k], context)
        seconds = _median_seconds(operations, repeats)
    decode = seconds["decode"]
    threads = torch.get_num_threads()
    detail = (f"CPU, float32, {threads} torch thread{'s' if threads != 1 else ''}, context {context} tokens, "
              f"median of {repeats} alternating rounds; target decode step {decode * 1000:.1f} ms")
    return Costs("measured", detail, {k: seconds[f"draft {k}"] / decode for k in ks},
                 {k: seconds[f"verify {k}"] / decode for k in ks}, decode_seconds=decode)
