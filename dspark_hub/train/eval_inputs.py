"""What `eval` measures on: the draft under test, the target it pairs with, and the rollouts.

A draft is a k3_dspark or a speculators DSpark checkpoint (`read_draft`: its format, taps and k);
its target must pair with it (`refuse_unpaired_teacher`); the rollouts come from a prompts file
the target continues greedily (float32 taps, `max_new_tokens + k` tokens ignoring EOS, so the last
step can overshoot as it does in vLLM) or from a rollouts folder (`load_eval_rollouts`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_hub.errors import UsageError
from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.digests import sha256_file
from dspark_hub.format.registry import K3, SPECULATORS, DraftFormat
from dspark_hub.format.tensorio import tensor_files
from dspark_hub.progress import Progress, announce_stage, announce_total
from dspark_hub.train.acceptance import ProposeMany, draft_batch_proposer, one_at_a_time, speculators_proposer
from dspark_hub.train.data_checks import read_tensor
from dspark_hub.train.draft_taps import tap_view
from dspark_hub.train.generate import Rollout, generate_rollouts
from dspark_hub.train.rollouts import MemoryRollouts, RolloutData, read_prompts
from dspark_hub.train.teacher import (
    chat_template_digest,
    load_teacher,
    read_json,
    read_lm_head,
    read_teacher_config,
    teacher_eos_ids,
    teacher_identity,
)
from dspark_hub.verify.family import detect
from dspark_hub.vllm.pin import PINNED_VERSION

if TYPE_CHECKING:
    import torch

    from dspark_hub.modeling import K3DSparkModel


@dataclass(frozen=True)
class DraftUnderTest:
    """A draft folder as eval sees it: its format, its taps (our convention) and its k."""

    path: str
    config: dict[str, Any]
    format: DraftFormat
    taps: list[int]                   # target_layer_ids convention: output of layer l
    k: int


def read_draft(path: str | os.PathLike[str], block_size: int | None = None, *,
               param: str | None = "draft") -> DraftUnderTest:
    """The draft's format (k3_dspark or speculators DSpark), taps and k (`block_size` wins over the config's).

    Raises:
        UsageError: another draft family, taps eval cannot capture, or no k.
    """
    config = read_json(Path(path) / CONFIG_NAME, what="a draft checkpoint folder that holds config.json",
                       param=param)
    fmt, found = detect(config)
    if fmt is None:
        raise UsageError(f"{path}: is {found.spec.title}; eval measures a k3_dspark or a speculators DSpark draft",
                         param="draft")
    keys = fmt.pairing_keys(config)
    taps = keys.taps
    if not taps or any(not isinstance(t, int) or t < 0 for t in taps):
        raise UsageError(f"{path}/config.json: {keys.taps_key} is {keys.native_taps!r}; eval captures the output of "
                         "target layers 0..L-1 (a speculators aux id 0, the embedding output, is not captured)")
    if taps != sorted(set(taps)):
        raise UsageError(f"{path}/config.json: {keys.taps_key} {keys.native_taps} are not ascending and distinct; "
                         "the runtimes concatenate the taps in ascending order")
    if fmt.anchor_layout_key is not None and fmt.anchor_layout_key not in config:
        raise UsageError(f"{path}/config.json: no {fmt.anchor_layout_key}; its trainer and vLLM default the block "
                         f"layout differently (speculators drafts from the anchor, vLLM {PINNED_VERSION} serves a "
                         "bonus-anchor block); write the key")
    k = block_size if block_size is not None else fmt.serving(config).num_speculative_tokens
    if not isinstance(k, int) or k <= 0:
        raise UsageError(f"{path}/config.json: no number of speculative tokens "
                         "(speculators_config.proposal_methods[0].speculative_tokens); pass `block_size`")
    return DraftUnderTest(str(path), config, fmt, list(taps), k)


def refuse_unpaired_teacher(draft: DraftUnderTest, teacher_config: Mapping[str, Any], teacher: str) -> None:
    """Refuse a teacher the draft does not pair with (hidden size, vocabulary, taps in range).

    Raises:
        TeacherMismatchError: one line naming the first disagreeing key.
        UsageError: a tap out of the teacher's range.
    """
    tap_view(draft.config, teacher_config, where=f"{draft.path}/{CONFIG_NAME}", target=teacher, param="draft")


def stop_token_ids(teacher: str | os.PathLike[str], ignore_eos: bool) -> list[int]:
    """The target's EOS ids (`teacher.teacher_eos_ids`: generation_config.json, else config.json), none with
    `ignore_eos`."""
    return [] if ignore_eos else teacher_eos_ids(teacher)


def read_embedding(teacher: str | os.PathLike[str]) -> torch.Tensor:
    """The teacher's input embedding `[V, H]`, read from its safetensors (no model built)."""
    files = tensor_files(teacher)
    hits = [n for n in files if n == "embed_tokens.weight" or n.endswith(".embed_tokens.weight")]
    if len(hits) != 1:
        raise UsageError(f"{teacher}: no unique embed_tokens.weight among {len(files)} tensors; pass a causal LM "
                         "checkpoint folder", param="teacher")
    return read_tensor(files[hits[0]], hits[0])


def _load_draft(path: str | os.PathLike[str]) -> K3DSparkModel:
    # torch and modeling (transformers): only a measurement of a k3_dspark draft pays for them
    import torch

    from dspark_hub.modeling import load_checkpoint

    model: K3DSparkModel = load_checkpoint(path, dtype=torch.float32).model
    model.train(False)
    return model


def load_eval_rollouts(draft: DraftUnderTest, *, teacher: str | None, prompts: str | None, data: str | None,
                       max_new_tokens: int, batch_size: int, progress: Progress | None = None
                       ) -> tuple[RolloutData | MemoryRollouts, str, dict[str, Any]]:
    """(rollouts, teacher path, harness facts about the data) from a prompts file or a rollouts folder.

    From prompts the teacher rolls out `max_new_tokens + k` tokens ignoring EOS (the last step may
    overshoot, and the simulation applies the stop tokens itself), with float32 taps.
    """
    import torch  # heavy: only a run that loads rollouts pays for it

    if (prompts is None) == (data is None):
        raise UsageError("pass exactly one of `prompts` (with `teacher`) and `data`")
    if data is not None:
        rollouts = RolloutData(data, param="data")
        announce_total(progress, len(rollouts))
        teacher = teacher or rollouts.teacher_path
        settings = rollouts.manifest["settings"]
        if list(settings.get("target_layer_ids", draft.taps)) != draft.taps:
            raise UsageError(f"{data}: the rollouts hold the taps of layers {settings['target_layer_ids']}, the draft "
                             f"reads {draft.taps}; roll out with this draft's config", param="data")
        identity = rollouts.manifest["teacher"]
        facts = {"prompts_sha256": settings["prompts_sha256"], "max_new_tokens": settings["max_new_tokens"],
                 "chat_template_sha256": rollouts.manifest.get("chat_template_sha256"),
                 "teacher": identity["label"], "teacher_identity": identity, "data": str(data)}
        if teacher is None:
            raise UsageError(f"{data}: the manifest names no teacher; pass `teacher`")
        return rollouts, teacher, facts
    if teacher is None:
        raise UsageError("needs `teacher`", param="prompts")
    assert prompts is not None   # exactly one of prompts and data, checked above
    refuse_unpaired_teacher(draft, read_teacher_config(teacher, param="teacher"), teacher)
    items = read_prompts(prompts, teacher, param="prompts", budget=max_new_tokens + draft.k)  # before the teacher loads
    model = load_teacher(teacher)
    announce_stage(progress, "eval: teacher continuations", len(items))
    memory = MemoryRollouts(list(generate_rollouts(model, items, draft.taps, max_new_tokens=max_new_tokens + draft.k,
                                                   batch_size=batch_size, ignore_eos=True, progress=progress,
                                                   states_dtype=torch.float32)))
    memory.rollouts.sort(key=lambda r: r.prompt_index)
    identity = teacher_identity(teacher).to_dict()
    facts = {"prompts_sha256": sha256_file(prompts), "max_new_tokens": max_new_tokens,
             "chat_template_sha256": chat_template_digest(teacher), "teacher": identity["label"],
             "teacher_identity": identity, "data": None}
    return memory, teacher, facts


def make_proposer(draft: DraftUnderTest, teacher: str, *,
                  markov: bool) -> Callable[[list[Rollout]], ProposeMany]:
    """rollouts -> propose_many (`acceptance.measure_batched`), for either format."""
    if not markov and not draft.format.markov_optional:
        raise UsageError(f"a {draft.format.title} draft always drafts with its Markov head; `markov` False is for "
                         "drafts whose head is optional")
    lm_head = read_lm_head(teacher).float()
    return PROPOSERS[draft.format.name](draft, teacher, lm_head, markov)


def _speculators_proposer(draft: DraftUnderTest, teacher: str, lm_head: torch.Tensor,
                          markov: bool) -> Callable[[list[Rollout]], ProposeMany]:
    import torch  # heavy: only a measurement pays for it

    # modeling imports torch and transformers: only a measurement of a speculators draft pays for them
    from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark

    model = SpeculatorsDSpark.from_folder(draft.path, read_embedding(teacher), lm_head, dtype=torch.float32,
                                          markov=markov)
    # its pruned vocabulary makes a request cheap (10 ms on SmolLM2): drafted one at a time
    return one_at_a_time(lambda r: speculators_proposer(model, r, draft.k))


def _k3_proposer(draft: DraftUnderTest, teacher: str, lm_head: torch.Tensor,
                 markov: bool) -> Callable[[list[Rollout]], ProposeMany]:
    k3 = _load_draft(draft.path)
    return lambda rollouts: draft_batch_proposer(k3, lm_head, rollouts, draft.k)


#: How a draft of each format proposes (the modeling classes sit above format/, so the table lives here).
PROPOSERS = {K3.name: _k3_proposer, SPECULATORS.name: _speculators_proposer}
