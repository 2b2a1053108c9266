"""The target's greedy paths with its states at every layer the probe's readings tap, captured in one pass.

`greedy_paths` runs the target once (the `transformers` engine, float32 states): it continues each prompt
greedily, or takes a rollouts folder's sequences as they are, and records the output of every layer asked for
plus the final-normed state. Every reading of the draft (declared taps, shifted taps, the last tap normed) is
then a choice of columns of these states: the target's forward passes are shared by every candidate.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from dspark_hub.progress import Progress, announce_stage
from dspark_hub.train.data.rollouts import RolloutData, read_prompts
from dspark_hub.train.evaluation.expected import GreedyPath
from dspark_hub.train.target.engines import EngineOptions, Mode, open_engine
from dspark_hub.train.target.generate import Prompt, Rollout
from dspark_hub.train.target.target import Target


def greedy_paths(target: Target, layers: Iterable[int], *, prompts: str | os.PathLike[str] | None = None,
                 data: str | os.PathLike[str] | None = None, max_new_tokens: int = 64, batch_size: int = 16,
                 progress: Progress | None = None) -> list[GreedyPath]:
    """Each prompt's greedy path (`max_new_tokens` tokens, ignoring EOS), or each sequence of the rollouts folder
    `data` as it is, with the target's float32 states at `layers` (our convention) and after its final norm."""
    wanted = sorted(set(layers))
    if data is not None:
        folder = RolloutData(data, param="data")
        items = [_as_prompt(rollout) for rollout in folder]
        mode: Mode = "prefill"
    else:
        assert prompts is not None
        items = read_prompts(prompts, target, param="prompts")
        mode = "generate"
    engine = open_engine("transformers", target, wanted, EngineOptions(dtype="float32"))
    announce_stage(progress, "probe: target paths", len(items))
    try:
        made = list(engine.rollouts(items, mode=mode, max_new_tokens=max_new_tokens, ignore_eos=True,
                                    batch_size=batch_size, progress=progress, states_dtype="float32"))
    finally:
        engine.close()
    return [_split(rollout, wanted) for rollout in sorted(made, key=lambda r: r.prompt_index)]


def stored_paths(data: str | os.PathLike[str]) -> list[GreedyPath]:
    """A rollouts folder's sequences with the states it stores (its own taps, as captured: nothing runs), for
    readings of those taps only."""
    folder = RolloutData(data, param="data")
    layers = list(folder.manifest["settings"]["target_layer_ids"])
    return [_split(rollout, layers) for rollout in sorted(folder, key=lambda r: r.prompt_index)]


def _as_prompt(rollout: Rollout) -> Prompt:
    """A rollouts folder's sequence as a prefill prompt: its tokens, supervised from its prompt's end."""
    n = int(rollout.input_ids.shape[0])
    mask = [0] * rollout.prompt_length + [1] * (n - rollout.prompt_length)
    return Prompt(rollout.prompt_index, rollout.input_ids.tolist(), rollout.dataset, mask)


def _split(rollout: Rollout, layers: list[int]) -> GreedyPath:
    width = rollout.final_hidden_states.shape[-1]
    states = rollout.aux_hidden_states.float()
    by_layer = {layer: states[:, i * width:(i + 1) * width] for i, layer in enumerate(layers)}
    return GreedyPath(rollout.prompt_index, rollout.input_ids.long(), rollout.prompt_length, by_layer,
                      rollout.final_hidden_states.float())
