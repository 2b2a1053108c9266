"""What a trained confidence head estimates, what its loss trains it toward, and what greedy serving accepts.

Usage:
    python bench/confidence_targets.py DRAFT DATA [--target DIR] [--k K] [--rollouts N]

Teacher-forced, on a rollouts folder's held-out sequences (the target's greedy paths), at every anchor of
every continuation with K slots after it: a DSpark block's rows do not depend on the drafts, and its Markov
head reads the previous token, which is the data's once the drafts before it were accepted. So slot i's
teacher-forced values, over the anchors whose slots 0 .. i-1 matched the path, are what serving sees at
slot i once the prefix survived. Per slot, over those anchors:

- `confidence`: the head's mean sigmoid `c_i`, its estimate of that conditional acceptance;
- `overlap`: the mean `sum_x min(p(x), q(x))` = 1 - TV(p, q): what `finetune`'s confidence term (and
  speculators') trains `c_i` toward (BCE against the detached overlap), the acceptance probability of
  speculative sampling at temperature 1 with drafts sampled from q;
- `p(argmax q)`: the acceptance probability at temperature 1 with greedy drafting (vLLM's default
  `draft_sample_method`);
- `greedy`: how often argmax q is the path's token, the acceptance at temperature 0 (what `eval` measures).

Prints one table per draft, and the same as JSON (`--json`). Float32, this process's torch threads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from dspark_hub.train.data.rollouts import RolloutData
from dspark_hub.train.evaluation.inputs import read_draft
from dspark_hub.train.target.target import Target

#: Drafts loaded once per process (path -> model).
_MODELS: dict[str, object] = {}


def _k3_slots(path: str, target: Target, rollout, k: int, lm_head: torch.Tensor):
    """Per anchor, per slot: (c, overlap, p(argmax q), hit) of a k3_dspark draft, all anchors in one pass."""
    from dspark_hub.modeling import load_checkpoint

    if path not in _MODELS:
        _MODELS[path] = load_checkpoint(path, dtype=torch.float32).model.eval()
    model = _MODELS[path]
    ids, start = rollout.input_ids, rollout.prompt_length
    anchors = torch.arange(start, len(ids) - k)
    if not len(anchors):
        return []
    out = model.teacher_forced(rollout.aux_hidden_states[None].float(), ids[None], anchors[None], block_size=k,
                               lm_head_weight=lm_head)
    q = out.logits[0].softmax(-1)                                         # [A, K, V]
    p = (rollout.final_hidden_states.float()[out.target_positions[0]] @ lm_head.T).softmax(-1)
    c = torch.sigmoid(out.confidence_logits[0]) if out.confidence_logits is not None else None
    guess = q.argmax(-1)
    truth = ids[(anchors[:, None] + torch.arange(1, k + 1)[None]).clamp(max=len(ids) - 1)]
    rows = torch.stack([c if c is not None else torch.full_like(guess, float("nan"), dtype=torch.float32),
                        torch.minimum(p, q).sum(-1), p.gather(-1, guess[..., None])[..., 0],
                        (guess == truth).float()], -1)
    return rows.tolist()


def _spec_slots(path: str, target: Target, rollout, k: int, lm_head: torch.Tensor):
    """The same for a speculators DSpark (pruned vocabulary mapped to target ids), one anchor at a time."""
    from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark

    if path not in _MODELS:
        _MODELS[path] = SpeculatorsDSpark.from_folder(path, target.embedding(), lm_head)
    draft = _MODELS[path]
    ids, start = rollout.input_ids, rollout.prompt_length
    kv = draft.context_kv(draft.context(rollout.aux_hidden_states.float()))
    vocab = torch.arange(draft.lm_head.shape[0])
    to_target = vocab if draft.d2t is None else vocab + draft.d2t.long()
    target_probs = (rollout.final_hidden_states.float() @ lm_head.T).softmax(-1)[:, to_target]
    rows = []
    # The block pass reads block_size tokens of the path from the anchor on, whatever k is scored.
    for a in range(start, len(ids) - max(k, draft.block_size)):
        logits, conf = draft.teacher_forced(rollout.aux_hidden_states, ids, a, kv=kv)
        q = logits[:k].softmax(-1)
        p = target_probs[a:a + k]
        guess = q.argmax(-1)
        c = torch.sigmoid(conf[:k]) if conf is not None else torch.full((k,), float("nan"))
        hit = (to_target[guess] == ids[a + 1:a + 1 + k]).float()
        rows.append(torch.stack([c, torch.minimum(p, q).sum(-1), p.gather(-1, guess[:, None])[:, 0], hit],
                                -1).tolist())
    return rows


def summarize(steps: list[list[list[float]]], k: int) -> list[dict[str, float]]:
    """Per slot, the means over the anchors whose earlier slots all matched the path."""
    out = []
    for i in range(k):
        kept = [s[i] for s in steps if all(s[j][3] == 1.0 for j in range(i))]
        n = len(kept)
        mean = [sum(row[c] for row in kept) / n if n else float("nan") for c in range(4)]
        out.append({"slot": i, "anchors": n, "confidence": mean[0], "overlap": mean[1], "p_argmax_q": mean[2],
                    "greedy": mean[3]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draft")
    parser.add_argument("data")
    parser.add_argument("--target", help="the target folder (default: the rollouts manifest's)")
    parser.add_argument("--k", type=int, help="slots (default: the draft's k)")
    parser.add_argument("--rollouts", type=int, help="only the first N held-out sequences")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data = RolloutData(args.data)
    target = Target.open(args.target or data.target_path)
    draft = read_draft(args.draft, args.k)
    lm_head = target.lm_head().float()
    slots = _k3_slots if draft.format.trainable else _spec_slots
    steps: list[list[list[float]]] = []
    with torch.no_grad():
        for n, rollout in enumerate(data):
            if args.rollouts is not None and n >= args.rollouts:
                break
            steps += slots(args.draft, target, rollout, draft.k, lm_head)
    table = summarize(steps, draft.k)
    if args.json:
        json.dump({"draft": args.draft, "k": draft.k, "slots": table}, sys.stdout, indent=1)
        print()
        return
    print(f"{Path(args.draft).name}: k {draft.k}, {len(steps)} anchors (teacher-forced; a slot over the anchors "
          "whose earlier slots matched the path)")
    print("| slot | anchors | confidence c_i | overlap 1 - TV (its BCE target) | p(argmax q) (T=1, greedy drafts) "
          "| greedy acceptance (T=0) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in table:
        print(f"| {row['slot']} | {row['anchors']} | {row['confidence']:.3f} | {row['overlap']:.3f} | "
              f"{row['p_argmax_q']:.3f} | {row['greedy']:.3f} |")


if __name__ == "__main__":
    main()
