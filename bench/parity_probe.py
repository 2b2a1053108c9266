"""Where a greedy vLLM measurement and the simulation part: each request's accepted drafts, step by step.

Usage:
    python bench/parity_probe.py DRAFT TARGET PROMPTS --vllm-python PY [--max-new-tokens N] [--out FILE]

For a speculators DSpark draft: vLLM 0.32.0 serves the prompts greedily with per-request step-by-step counts
(`per_request_spec_decode_metrics="detailed"`), the simulation verifies the same prompts on the target's
float32 greedy paths, recording for every step its anchor, drafts, accepted count and each slot's lead of
the draft's top logit over its second (`SpeculatorsDSpark.propose(margins=...)`). Every request whose steps
differ is printed at its first differing step, with those margins: a lead of a few 1e-6 is a near-tie that
float32 arithmetic in two engines may break differently (docs/real-model.md, "Greedy parity"). Writes the
whole record to `--out` (JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def simulated_steps(draft: str, target: str, prompts: str, max_new_tokens: int) -> tuple[list[dict], object]:
    import torch

    from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark
    from dspark_hub.train.evaluation.acceptance import VerifyLoop, longest_prefix
    from dspark_hub.train.evaluation.inputs import open_inputs

    torch.set_num_threads(1)
    inputs = open_inputs(draft, target=target, prompts=prompts, data=None, max_new_tokens=max_new_tokens)
    assert inputs.rollouts is not None
    k = inputs.draft.k
    model = SpeculatorsDSpark.from_folder(draft, inputs.target.embedding(), inputs.target.lm_head().float())
    out = []
    for rollout in inputs.rollouts:
        kv = model.context_kv(model.context(rollout.aux_hidden_states))
        ids = rollout.input_ids.tolist()
        loop = VerifyLoop(rollout, k, max_tokens=max_new_tokens, stop_ids=inputs.stop_ids)
        steps = []
        while (p := loop.anchor) is not None:
            margins: list[float] = []
            drafts = model.propose(kv, ids[p], p, k, margins=margins)
            accepted = longest_prefix(drafts, ids[p + 1:p + 1 + k])
            steps.append({"anchor": p, "accepted": accepted, "drafts": drafts, "path": ids[p + 1:p + 1 + k],
                          "margins": [round(m, 7) for m in margins]})
            loop.step_accepted(accepted)
        out.append({"prompt_index": rollout.prompt_index, "steps": steps})
    return out, inputs


def measured_steps(inputs: object, max_new_tokens: int, python: str) -> list[list[int]]:
    from dspark_hub.train.evaluation.vllm_eval import dataset_groups, measure

    items = inputs.prompts  # type: ignore[attr-defined]
    groups = dataset_groups(items)
    _, speculative, _ = measure(inputs.target.path, inputs.draft.path, [p.input_ids for p in items], groups,  # type: ignore[attr-defined]
                                k=inputs.draft.k, max_tokens=max_new_tokens, stop_token_ids=inputs.stop_ids,  # type: ignore[attr-defined]
                                python=python, request_metrics="detailed")
    by_prompt: dict[int, list[int]] = {}
    for g, group in enumerate(groups):
        for i, steps in zip(group, speculative.report["groups"][g]["steps"], strict=True):
            by_prompt[items[i].index] = steps
    return [by_prompt[item.index] for item in items]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draft")
    parser.add_argument("target")
    parser.add_argument("prompts")
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    simulated, inputs = simulated_steps(args.draft, args.target, args.prompts, args.max_new_tokens)
    measured = measured_steps(inputs, args.max_new_tokens, args.vllm_python)
    differing = []
    for sim, vllm in zip(simulated, measured, strict=True):
        mine = [s["accepted"] for s in sim["steps"]]
        if mine == vllm:
            continue
        first = next((i for i, (a, b) in enumerate(zip(mine, vllm, strict=False)) if a != b),
                     min(len(mine), len(vllm)))
        step = sim["steps"][first] if first < len(sim["steps"]) else None
        differing.append({"prompt_index": sim["prompt_index"], "step": first, "simulated": mine, "vllm": vllm,
                          "at": step})
        print(f"prompt {sim['prompt_index']}: step {first}: simulated {mine[first] if first < len(mine) else '-'}, "
              f"vLLM {vllm[first] if first < len(vllm) else '-'} accepted; "
              + (f"anchor {step['anchor']}, drafts {step['drafts']}, path {step['path']}, draft top-2 leads "
                 f"{step['margins']}" if step else "past the simulation's last step"))
    total = sum(len(s["steps"]) for s in simulated)
    print(f"{len(differing)} of {len(simulated)} requests differ; {total} simulated steps, "
          f"{sum(len(v) for v in measured)} vLLM steps")
    if args.out:
        args.out.write_text(json.dumps({"simulated": simulated, "vllm": measured, "differing": differing}) + "\n")


if __name__ == "__main__":
    main()
