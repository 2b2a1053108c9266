"""`eval --profile`: the `speculation_profile.json` eval writes beside the draft (the one file of the draft's folder
it writes), from one lockstep pass's counts per k and the speedup (`serving.measure_serving`).

Its keys are Model-Optimizer's plus ours (`format.speculation_profile`); the draft is named by its Hub id or the
digests of its files, never its path, and the target by its identity. `evaluate.check_profile_writable` refuses an
existing one without `force` before the run; the write itself is atomic and refuses one that appeared meanwhile.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_hub.format.checkpoint import LocalSource
from dspark_hub.format.provenance import describe, identify
from dspark_hub.format.speculation_profile import PROFILE_NAME, KCounts, ProfileInputs, build_profile, trained_k
from dspark_hub.format.writer import atomic_file
from dspark_hub.train.evaluation.acceptance import DEFINITION
from dspark_hub.train.evaluation.decoding import simulated_decoding

if TYPE_CHECKING:
    from dspark_hub.train.evaluation.acceptance import Sweep
    from dspark_hub.train.evaluation.inputs import DraftUnderTest, EvalInputs
    from dspark_hub.train.evaluation.speedup import Speedup


def write_profile(inputs: EvalInputs, sweep: Sweep, speedup: Speedup | None, *, force: bool) -> Path:
    """`speculation_profile.json` beside the draft, written atomically (refused over one without `force`)."""
    doc = build_profile(profile_inputs(inputs, sweep, speedup))
    path = Path(inputs.draft.path) / PROFILE_NAME
    with atomic_file(path, force=force, mode="w") as handle:
        handle.write(json.dumps(doc, indent=2) + "\n")
    return path


def profile_inputs(inputs: EvalInputs, sweep: Sweep, speedup: Speedup | None) -> ProfileInputs:
    """The profile's facts: the counts per k, the draft by its digests (never its path), the target by its identity."""
    draft = inputs.draft
    named = _draft_id(draft)
    by_k = {k: KCounts(k, m.overall.drafts, m.overall.accepted_per_position, m.per_request_acceptance_length)
            for k, m in sweep.by_k.items()}
    trained, _ = trained_k(draft.format, draft.config, LocalSource(draft.path))
    facts = inputs.facts
    decoding = simulated_decoding(inputs.sampling)
    conditions = {"engine": f"dspark-hub eval, simulated ({decoding.pop('simulation')})", **decoding,
                  "dtype": "float32", "prompts": sweep.by_k[draft.k].overall.prompts,
                  "prompts_sha256": facts.get("prompts_sha256"), "max_new_tokens": facts.get("max_new_tokens"),
                  "datasets": sorted(sweep.by_k[draft.k].measurement.by_dataset)}
    return ProfileInputs(
        by_k=by_k, num_speculative_tokens=draft.k, draft_checkpoint=named,
        target_model=facts.get("teacher"), block_size=draft.format.block_size(draft.config) or trained,
        trained_k=trained,
        per_category={name: stats.acceptance_length
                      for name, stats in sweep.by_k[draft.k].measurement.by_dataset.items()},
        measurement_conditions=conditions, definition=DEFINITION,
        speedup=speedup.to_dict() if speedup is not None else None)


def _draft_id(draft: DraftUnderTest) -> str | None:
    """The draft as a profile names it: its Hub id, or the digests of its files (the profile itself left out)."""
    identity = identify(draft.path)
    if isinstance(identity, dict) and isinstance(identity.get("sha256"), dict):
        identity["sha256"].pop(PROFILE_NAME, None)
    return describe(identity)
