"""What `eval` measures on, opened in one step: the draft under test, the target it pairs with, the data.

A draft is a k3_dspark or a speculators DSpark checkpoint (`read_draft`: its format, taps and k);
its target (`target.Target`, opened once) must pair with it; the data is a prompts file or a
rollouts folder. For the simulation the rollouts are made here, by the target's continuations of the
prompts (`paths.continue_prompts`: greedy, or `samples` sampled paths a prompt, one rollout per unit);
a rollouts folder is read as it is. The vllm engine makes its own continuations: it gets the prompts
(`open_inputs(..., engine="vllm")`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_hub.errors import UsageError
from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.digests import sha256_file
from dspark_hub.format.jsonio import read_json_input
from dspark_hub.format.registry import DraftFormat
from dspark_hub.progress import Progress, announce_total
from dspark_hub.train.data.draft_taps import tap_view
from dspark_hub.train.data.rollouts import MemoryRollouts, RolloutData, read_prompts
from dspark_hub.train.evaluation.decoding import GREEDY, EvalSampling
from dspark_hub.train.evaluation.paths import PathTarget, Unit, continue_prompts, rollout_unit
from dspark_hub.train.target.generate import Prompt
from dspark_hub.train.target.target import Target
from dspark_hub.verify.family import detect
from dspark_hub.vllm.availability import engine_python
from dspark_hub.vllm.pin import PINNED_VERSION


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
    config = read_json_input(Path(path) / CONFIG_NAME, what="a draft checkpoint folder that holds config.json",
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


@dataclass
class EvalInputs:
    """Everything one eval measures on: the draft (and a reference draft), the target, and the data.

    `rollouts` is what the simulation runs on (None for the vllm engine, which continues `prompts`
    itself); `stop_ids` the target's EOS ids (`Target.eos_ids`; none with `ignore_eos`); `facts` the
    harness facts about the data (prompts digest, chat template, target identity). `units[i]` is the
    prompt and sample of `rollouts[i]`; a sampled eval's `path_targets` what its sampling steps recorded
    (`paths.PathTarget`, by rollout index).
    """

    draft: DraftUnderTest
    target: Target
    reference: DraftUnderTest | None = None
    prompts: list[Prompt] = field(default_factory=list)
    rollouts: RolloutData | MemoryRollouts | None = None
    stop_ids: list[int] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    python: str | None = None         # the vllm engine's interpreter
    sampling: EvalSampling = GREEDY
    units: list[Unit] = field(default_factory=list)
    path_targets: dict[int, PathTarget] = field(default_factory=dict)


def open_inputs(draft: str | os.PathLike[str], *, target: str | os.PathLike[str] | None, prompts: str | None,
                data: str | None, reference: str | None = None, block_size: int | None = None,
                engine: str = "simulated", max_new_tokens: int = 256, batch_size: int = 8, ignore_eos: bool = False,
                vllm_python: str | os.PathLike[str] | None = None, sampling: EvalSampling = GREEDY,
                longest_k: int | None = None,
                progress: Progress | None = None) -> EvalInputs:
    """The draft, the target and the data of one eval, every input checked before any model loads.

    For the simulation the rollouts are made from `prompts` (the target in the `transformers` engine,
    float32 states, `max_new_tokens + k` tokens ignoring EOS, k the largest of the draft's and `longest_k`:
    a k sweep's last steps overshoot too) or read from `data`; the vllm engine gets the prompts and its
    interpreter (`vllm_python`, else this one: checked before the target is read).

    Raises:
        MissingDependencyError: the vllm engine and no interpreter that can import vLLM.
        UsageError: not exactly one of `prompts` and `data`, no target, what the engine cannot do, a
            draft eval cannot measure, or a reference with other taps.
        TargetMismatchError: the target does not pair with the draft.
    """
    under_test = read_draft(draft, block_size)
    _refuse_for_engine(engine, prompts=prompts, data=data, reference=reference, target=target)
    if data is not None and not sampling.greedy:
        raise UsageError("a rollouts folder holds greedy paths; a sampled eval continues `prompts` by sampling",
                         param="data")
    python = engine_python(vllm_python) if engine == "vllm" else None
    ref = read_draft(reference, under_test.k, param="reference") if reference else None
    if ref is not None and ref.taps != under_test.taps:
        raise UsageError(f"{reference}: taps layers {ref.taps}, the draft {under_test.taps}; a reference is "
                         "measured on the same rollouts, so it needs the same taps", param="reference")
    if data is not None:
        inputs = _folder_inputs(under_test, ref, data=data, target=target, ignore_eos=ignore_eos, progress=progress)
        inputs.units = [rollout_unit(r) for r in inputs.rollouts or ()]
        return inputs
    assert prompts is not None and target is not None    # `_refuse_for_engine` asked for both
    opened = Target.open(target, param="target")
    served = engine == "vllm"
    inputs = _paired(under_test, opened, prompts, reference=ref, ignore_eos=ignore_eos,
                     max_new_tokens=None if served else max_new_tokens)
    inputs.sampling = sampling
    if served:
        inputs.python = python
        return inputs
    paths = continue_prompts(opened, inputs.prompts, under_test.taps, sampling, max_new_tokens=max_new_tokens,
                             lookahead=max(under_test.k, longest_k or 0), batch_size=batch_size, progress=progress)
    inputs.rollouts, inputs.units, inputs.path_targets = paths.rollouts, paths.units, paths.targets
    return inputs


def _refuse_for_engine(engine: str, *, prompts: str | None, data: str | None, reference: str | None,
                       target: str | os.PathLike[str] | None) -> None:
    """The argument combinations the engine cannot measure, refused before anything is read but the draft."""
    if engine == "vllm":
        if data is not None:
            raise UsageError("the vllm engine generates its own continuations; pass `prompts` instead", param="data")
        if reference is not None:
            raise UsageError("the vllm engine measures one draft per run; measure the reference in a run of its own",
                             param="reference")
        if prompts is None or target is None:
            raise UsageError("the vllm engine needs `prompts` and `target`", param="prompts" if prompts is None
                             else "target")
    elif (prompts is None) == (data is None):
        raise UsageError("pass exactly one of `prompts` (with `target`) and `data`")
    elif data is None and target is None:
        raise UsageError("needs `target`", param="prompts")


def _folder_inputs(draft: DraftUnderTest, reference: DraftUnderTest | None, *, data: str,
                   target: str | os.PathLike[str] | None, ignore_eos: bool, progress: Progress | None) -> EvalInputs:
    """A rollouts folder as it is (bfloat16 taps, no tokens past its end); the target defaults to its manifest's."""
    rollouts = RolloutData(data, param="data")
    announce_total(progress, len(rollouts))
    settings = rollouts.manifest["settings"]
    if list(settings.get("target_layer_ids", draft.taps)) != draft.taps:
        raise UsageError(f"{data}: the rollouts hold the taps of layers {settings['target_layer_ids']}, the draft "
                         f"reads {draft.taps}; roll out with this draft's config", param="data")
    folder = target or rollouts.target_path
    if folder is None:
        raise UsageError(f"{data}: the manifest names no target; pass `target`")
    opened = Target.open(folder, param="target")
    identity = rollouts.manifest["teacher"]
    facts = {"prompts_sha256": settings["prompts_sha256"], "max_new_tokens": settings["max_new_tokens"],
             "chat_template_sha256": rollouts.manifest.get("chat_template_sha256"),
             "teacher": identity["label"], "teacher_identity": identity, "data": str(data)}
    return EvalInputs(draft, opened, reference, rollouts=rollouts, stop_ids=[] if ignore_eos else opened.eos_ids,
                      facts=facts)


def _paired(draft: DraftUnderTest, target: Target, prompts: str, *, reference: DraftUnderTest | None,
            ignore_eos: bool, max_new_tokens: int | None) -> EvalInputs:
    """The inputs once the target pairs with the draft (hidden size, vocabulary, taps in range) and the prompts
    are read (before any model loads), with the harness facts about the target (its identity, computed once)."""
    tap_view(draft.config, target.config, where=f"{draft.path}/{CONFIG_NAME}", target=target.path, param="draft")
    items = read_prompts(prompts, target, param="prompts", budget=(max_new_tokens or 0) + draft.k)   # fits its context
    identity = target.identity.to_dict()
    budget = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
    facts = {"prompts_sha256": sha256_file(prompts), **budget, "chat_template_sha256": target.chat_template_sha256,
             "teacher": identity["label"], "teacher_identity": identity, "data": None}
    return EvalInputs(draft, target, reference, prompts=items, stop_ids=[] if ignore_eos else target.eos_ids,
                      facts=facts)
