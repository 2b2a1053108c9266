"""Acceptance evaluation with vLLM's definitions: simulated, or measured by vLLM itself.

The definitions (vLLM 0.32.0's spec-decoding metrics, `DEFINITION`): a *draft* is one verification
step of one request that carried `k` drafted tokens; `accepted_per_position[i]` counts the drafts
whose first `i + 1` tokens were all accepted; `per_position[i] = accepted_per_position[i] / drafts`;
`acceptance_length = 1 + sum(per_position) = 1 + accepted / drafts`, the mean number of tokens a
verification step emits (the 1 is the target's own token). `k` is the number of drafted tokens per
step: the speculators `speculative_tokens` (the block size for a DSpark drafting from its anchor),
the reference 7 for k3_dspark, or `block_size` when given.

`engine="simulated"` (`SIMULATION`) replays vLLM's greedy verify loop in plain PyTorch: the
target's float32 greedy continuation of each prompt is the path vLLM emits (greedy speculative
decoding is lossless), rolled out `max_new_tokens + k` tokens so the last step can overshoot as it
does in vLLM. The request starts at the token sampled at prefill, `x_P`; each step the draft
proposes `k` tokens from the target's taps of positions `< p` and the anchor `x_p` (its Markov
head chained on its own drafts); `j` = the longest prefix equal to the path; the step counts
as one draft with `j` accepted, IN FULL even when it crosses `max_new_tokens`; it emits `j + 1`
tokens and the next anchor is `x_{p+j+1}`. The request stops once it has `max_new_tokens` tokens
or emitted a stop token (the teacher's EOS unless `ignore_eos`). On these fixtures the counts
equal vLLM's exactly (`tests/test_eval_parity.py`).

`engine="vllm"` (`dspark_hub.train.vllm_eval`) serves the target with the draft in vLLM and reads
the same counts from vLLM's metrics, plus `measured_by` and `lossless`.

A prompt-lookup drafter (n-gram copy) runs through the same simulation on the same paths, so a
looping or degenerate dataset cannot pass for a good draft.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_hub import schemas
from dspark_hub.errors import MissingDependencyError, UsageError
from dspark_hub.format.jsonio import is_int
from dspark_hub.format.provenance import describe, identify
from dspark_hub.progress import Progress, announce_stage, announce_total

if TYPE_CHECKING:
    import torch

    from dspark_hub.format.registry import DraftFormat
    from dspark_hub.modeling import K3DSparkModel
    from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark
    from dspark_hub.train.rollouts import MemoryRollouts, Rollout, RolloutData

DEFINITION = ("vLLM's spec-decoding metrics: drafts = verification steps that carried k drafted tokens; "
              "accepted_per_position[i] = drafts whose first i+1 tokens were all accepted; per_position[i] = "
              "accepted_per_position[i] / drafts; acceptance_length = 1 + sum(per_position) = 1 + accepted / drafts "
              "(mean tokens per verification step, the 1 being the target's own token)")
#: What the simulated numbers are, in a card's label: `simulated (<this>, k=K, float32, prompts F)`.
SIMULATION = "vLLM's greedy verify loop replayed on the target's float32 greedy path"
BASELINE = ("prompt lookup (as transformers prompt_lookup_decoding): copy the K tokens that followed the earliest "
            "earlier occurrence of the last n = 3, 2, 1 tokens")
ENGINES = ("simulated", "vllm")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class AcceptanceStats:
    """Counts of one decoding run, in vLLM's terms; merge runs by adding."""

    k: int
    drafts: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    tokens: int = 0
    prompts: int = 0

    def __post_init__(self) -> None:
        if not self.accepted_per_position:
            self.accepted_per_position = [0] * self.k

    def record(self, accepted: int) -> None:
        """One draft of which the first `accepted` tokens were accepted."""
        self.drafts += 1
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    def add(self, other: AcceptanceStats) -> None:
        self.drafts += other.drafts
        self.accepted_per_position = [a + b for a, b in zip(self.accepted_per_position, other.accepted_per_position,
                                                              strict=True)]
        self.tokens += other.tokens
        self.prompts += other.prompts

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_position)

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else float("nan")

    @property
    def per_position(self) -> list[float]:
        return [a / self.drafts if self.drafts else float("nan") for a in self.accepted_per_position]

    def to_dict(self) -> dict[str, Any]:
        return {"acceptance_length": self.acceptance_length, "per_position": self.per_position,
                "accepted_per_position": list(self.accepted_per_position), "drafts": self.drafts,
                "draft_tokens": self.drafts * self.k, "accepted": self.accepted, "k": self.k,
                "prompts": self.prompts, "tokens": self.tokens}


def longest_prefix(draft: list[int], truth: list[int]) -> int:
    j = 0
    while j < len(draft) and j < len(truth) and draft[j] == truth[j]:
        j += 1
    return j


def simulate(rollout: Rollout, propose: Callable[[int], list[int]], k: int, *, max_tokens: int | None = None,
             stop_ids: Iterable[int] = ()) -> AcceptanceStats:
    """vLLM's greedy verify loop over one rollout, with `propose(p) -> drafts` (`SIMULATION`).

    Args:
        rollout: `input_ids` (prompt, then the greedy path) and `prompt_length`.
        propose: the drafter; `propose(p)` drafts the tokens after position `p`.
        k: drafted tokens per step.
        max_tokens: the request's output budget (default: the rollout's continuation). A path that
            does not reach `k` tokens past the budget compares the last steps with what it holds.
        stop_ids: tokens that end the request when emitted.
    """
    tokens = rollout.input_ids.tolist()
    start = rollout.prompt_length
    budget = len(tokens) - start if max_tokens is None else min(max_tokens, len(tokens) - start)
    stats = AcceptanceStats(k, prompts=1)
    if budget <= 0:
        return stats
    stops = set(stop_ids)
    p, emitted, stopped = start, 1, tokens[start] in stops     # x_P is sampled at prefill
    while emitted < budget and not stopped:
        accepted = longest_prefix(propose(p)[:k], tokens[p + 1:p + 1 + k])
        stats.record(accepted)
        for token in tokens[p + 1:p + 2 + accepted]:            # the accepted drafts and the target's token
            if emitted >= budget:
                break
            emitted += 1
            if token in stops:
                stopped = True
                break
        p += accepted + 1
    stats.tokens = emitted
    return stats


def draft_proposer(model: K3DSparkModel, lm_head_weight: torch.Tensor, rollout: Rollout,
                   block_size: int) -> Callable[[int], list[int]]:
    """`propose(p)` for a k3_dspark draft: context = taps of positions < p, anchor = x_p."""
    import torch

    dtype, device = model.context_proj.weight.dtype, model.context_proj.weight.device
    with torch.no_grad():
        latents = model.encode_context(rollout.aux_hidden_states[None].to(device=device, dtype=dtype))
    ids = rollout.input_ids.to(device)

    def propose(p: int) -> list[int]:
        context = tuple(latent[:, :p] for latent in latents)
        proposal = model.propose_block(None, ids[p:p + 1], lm_head_weight, block_size=block_size,
                                       context_latents=context)
        assert proposal.tokens is not None   # propose_block always sets the tokens
        tokens: list[int] = proposal.tokens[0].tolist()
        return tokens

    return propose


def speculators_proposer(draft: SpeculatorsDSpark, rollout: Rollout, k: int) -> Callable[[int], list[int]]:
    """`propose(p)` for a speculators DSpark (`modeling.speculators_dspark.SpeculatorsDSpark`)."""
    import torch

    with torch.no_grad():
        kv = draft.context_kv(draft.context(rollout.aux_hidden_states))
    ids = rollout.input_ids.tolist()
    return lambda p: draft.propose(kv, ids[p], p, k)


def ngram_proposer(rollout: Rollout, block_size: int, max_ngram: int = 3,
                   min_ngram: int = 1) -> Callable[[int], list[int]]:
    """Prompt-lookup drafting over the tokens up to and including the anchor.

    As transformers' `prompt_lookup_decoding`: longest n first, the earliest earlier occurrence of
    the last n tokens, and the (up to K) tokens that followed it.
    """
    tokens = rollout.input_ids.tolist()

    def propose(p: int) -> list[int]:
        history = tokens[:p + 1]
        for n in range(max_ngram, min_ngram - 1, -1):
            suffix = history[-n:]
            for start in range(len(history) - n):
                if history[start:start + n] == suffix:
                    return history[start + n:start + n + block_size]
        return []

    return propose


@dataclass
class Measurement:
    """Acceptance over a set of rollouts, overall and per dataset label."""

    overall: AcceptanceStats
    by_dataset: dict[str, AcceptanceStats]

    def to_dict(self) -> dict[str, Any]:
        return {**self.overall.to_dict(), "by_dataset": {k: v.to_dict() for k, v in sorted(self.by_dataset.items())}}


def measure(rollouts: Iterable[Rollout], make_proposer: Callable[[Rollout], Callable[[int], list[int]]], k: int,
            progress: Progress | None = None, *, max_tokens: int | None = None,
            stop_ids: Iterable[int] = ()) -> Measurement:
    """Simulate every rollout with the proposer `make_proposer(rollout)` builds (`simulate`)."""
    stops = list(stop_ids)
    overall = AcceptanceStats(k)
    by_dataset: dict[str, AcceptanceStats] = {}
    for rollout in rollouts:
        stats = simulate(rollout, make_proposer(rollout), k, max_tokens=max_tokens, stop_ids=stops)
        overall.add(stats)
        if rollout.dataset is not None:
            by_dataset.setdefault(rollout.dataset, AcceptanceStats(k)).add(stats)
        if progress:
            progress(1)
    return Measurement(overall, by_dataset)


def measure_draft(model: K3DSparkModel, lm_head_weight: torch.Tensor, rollouts: Iterable[Rollout], block_size: int,
                  progress: Progress | None = None, **bounds: Any) -> Measurement:
    """Acceptance of a k3_dspark draft (in eval mode, no gradients) on rollouts; `bounds` as `measure`'s."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return measure(rollouts, lambda r: draft_proposer(model, lm_head_weight, r, block_size), block_size,
                           progress, **bounds)
    finally:
        model.train(was_training)


def measure_ngram(rollouts: Iterable[Rollout], block_size: int, **bounds: Any) -> Measurement:
    return measure(rollouts, lambda r: ngram_proposer(r, block_size), block_size, **bounds)


# ----------------------------------------------------------------------------- the command


@dataclass
class EvalResult:
    """What `dspark-hub eval` reports (`to_dict` is the `--json` document).

    `engine` is `simulated` or `vllm`; a vLLM measurement carries `measured_by` (the vLLM version,
    the exact speculative config, runner, interpreter, dtype) and `lossless` (its outputs equal
    plain greedy decoding's). A simulated one has neither (`null`).
    """

    draft: Measurement
    baseline: Measurement | None
    harness: dict[str, Any]
    reference: Measurement | None = None
    reference_path: str | None = None
    reference_identity: dict[str, Any] | None = None
    plot: str | None = None
    engine: str = "simulated"
    measured_by: dict[str, Any] | None = None
    lossless: bool | None = None

    @property
    def ok(self) -> bool:
        """False only for a vLLM measurement whose outputs differ from plain greedy decoding's."""
        return self.lossless is not False

    def to_dict(self) -> dict[str, Any]:
        overall = self.draft.overall
        by_dataset = {}
        for name, stats in sorted(self.draft.by_dataset.items()):
            entry = stats.to_dict()
            entry["baseline"] = self.baseline.by_dataset[name].to_dict() if self.baseline else None
            if self.reference is not None:
                entry["reference"] = self.reference.by_dataset[name].to_dict()
            by_dataset[name] = entry
        out = {"schema": schemas.command("eval"), "ok": self.ok, "engine": self.engine, **overall.to_dict(),
               "definition": DEFINITION, "by_dataset": by_dataset,
               "baseline": {"method": BASELINE, **self.baseline.overall.to_dict()} if self.baseline else None,
               "harness": self.harness, "reference": None, "plot": self.plot, "measured_by": self.measured_by,
               "lossless": self.lossless}
        if self.reference is not None:
            ref = self.reference.overall
            ratio = overall.acceptance_length / ref.acceptance_length
            out["reference"] = {"path": self.reference_path, "identity": self.reference_identity, **ref.to_dict(),
                                "ratio": ratio}
            # The card renders harness values as text: the reference by its Hub id or digests, never its path.
            named = describe(self.reference_identity) or "a local draft"
            out["harness"] = {**self.harness, "reference": f"{named} (acceptance length "
                              f"{ref.acceptance_length:.4f}; ratio {ratio:.4f})"}
        return out


@dataclass(frozen=True)
class DraftUnderTest:
    """A draft folder as eval sees it: its format, its taps (our convention) and its k."""

    path: str
    config: dict[str, Any]
    format: DraftFormat
    taps: list[int]                   # target_layer_ids convention: output of layer l
    k: int

    @property
    def is_speculators(self) -> bool:
        from dspark_hub.format.registry import SPECULATORS

        return self.format is SPECULATORS


def read_draft(path: str | os.PathLike[str], block_size: int | None = None, *,
               param: str | None = "draft") -> DraftUnderTest:
    """The draft's format (k3_dspark or speculators DSpark), taps and k (`block_size` wins over the config's).

    Raises:
        UsageError: another draft family, taps eval cannot capture, or no k.
    """
    from dspark_hub.format.registry import K3
    from dspark_hub.train.teacher import read_json
    from dspark_hub.verify.family import detect

    config = read_json(Path(path) / "config.json", what="a draft checkpoint folder that holds config.json",
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
    if fmt.name != K3.name and "sample_from_anchor" not in config:
        raise UsageError(f"{path}/config.json: no sample_from_anchor; speculators trains such a DSpark drafting from "
                         "its anchor while vLLM 0.32.0 serves it with a bonus-anchor block; write the key")
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
    from dspark_hub.format.taps import text_config
    from dspark_hub.train.teacher import TeacherMismatchError, check_teacher_matches

    if not draft.is_speculators:
        check_teacher_matches(teacher_config, draft.config, teacher_name=teacher)
        return
    keys = draft.format.pairing_keys(draft.config)
    target = text_config(teacher_config)
    for have, want, key in ((target.get("hidden_size"), keys.tap_width, keys.tap_width_key),
                            (target.get("vocab_size"), keys.vocab_size, keys.vocab_key)):
        if have != want:
            raise TeacherMismatchError(f"{teacher}: its config says {have}, the draft's {key} is {want}; pair the "
                                       "draft with the target it was trained against")
    layers = target.get("num_hidden_layers")
    if not is_int(layers):
        raise UsageError(f"{teacher}: its config has no num_hidden_layers to check the draft's taps against; pass "
                         "a transformers causal LM folder")
    bad = [f for f in draft.format.tap_findings(draft.config, layers) if f.severity == "error"]
    if bad or max(draft.taps) >= layers:
        raise UsageError(f"{teacher}: {bad[0].message if bad else 'a tap is past its last layer'}; pair the draft "
                         "with the target it was trained against")


def stop_token_ids(teacher: str | os.PathLike[str], ignore_eos: bool) -> list[int]:
    """The teacher's EOS ids (generation_config.json, else config.json), none with `ignore_eos`."""
    from dspark_hub.format.taps import text_config
    from dspark_hub.train.teacher import read_json

    if ignore_eos:
        return []
    for name in ("generation_config.json", "config.json"):
        path = Path(teacher) / name
        if path.is_file():
            config = read_json(path)
            eos = config.get("eos_token_id", text_config(config).get("eos_token_id"))
            if eos is not None:
                return [eos] if isinstance(eos, int) else [int(e) for e in eos]
    return []


def read_teacher_config(teacher: str | os.PathLike[str]) -> dict[str, Any]:
    """The teacher folder's `config.json` (errors name `teacher`)."""
    from dspark_hub.train.teacher import read_json

    return read_json(Path(teacher) / "config.json", what="a teacher folder that holds config.json", param="teacher")


def read_embedding(teacher: str | os.PathLike[str]) -> torch.Tensor:
    """The teacher's input embedding `[V, H]`, read from its safetensors (no model built)."""
    from safetensors import safe_open

    from dspark_hub.format.tensorio import tensor_files

    files = tensor_files(teacher)
    hits = [n for n in files if n == "embed_tokens.weight" or n.endswith(".embed_tokens.weight")]
    if len(hits) != 1:
        raise UsageError(f"{teacher}: no unique embed_tokens.weight among {len(files)} tensors; pass a causal LM "
                         "checkpoint folder", param="teacher")
    with safe_open(str(files[hits[0]]), framework="pt") as handle:
        return handle.get_tensor(hits[0])


def _load_draft(path: str | os.PathLike[str]) -> K3DSparkModel:
    import torch

    from dspark_hub.modeling import load_checkpoint

    return load_checkpoint(path, dtype=torch.float32).model.eval()


def load_eval_rollouts(draft: DraftUnderTest, *, teacher: str | None, prompts: str | None, data: str | None,
                       max_new_tokens: int, batch_size: int, progress: Progress | None = None
                       ) -> tuple[RolloutData | MemoryRollouts, str, dict[str, Any]]:
    """(rollouts, teacher path, harness facts about the data) from a prompts file or a rollouts folder.

    From prompts the teacher rolls out `max_new_tokens + k` tokens ignoring EOS (the last step may
    overshoot, and the simulation applies the stop tokens itself), with float32 taps.
    """
    import torch

    from dspark_hub.train.rollouts import MemoryRollouts, RolloutData, generate_rollouts, read_prompts
    from dspark_hub.train.teacher import chat_template_digest, load_teacher, sha256_file, teacher_identity

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
    refuse_unpaired_teacher(draft, read_teacher_config(teacher), teacher)
    items = read_prompts(prompts, teacher, param="prompts")   # before the teacher loads
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


def _make_proposer(draft: DraftUnderTest, teacher: str, *,
                   markov: bool) -> Callable[[Rollout], Callable[[int], list[int]]]:
    """rollout -> propose(p), for either format."""
    import torch

    from dspark_hub.train.teacher import read_lm_head

    lm_head = read_lm_head(teacher).float()
    if draft.is_speculators:
        from dspark_hub.modeling.speculators_dspark import SpeculatorsDSpark

        model = SpeculatorsDSpark.from_folder(draft.path, read_embedding(teacher), lm_head, dtype=torch.float32,
                                              markov=markov)
        return lambda r: speculators_proposer(model, r, draft.k)
    if not markov:
        raise UsageError("a k3_dspark draft always drafts with its Markov head; `markov` False is for speculators "
                         "drafts")
    k3 = _load_draft(draft.path)
    return lambda r: draft_proposer(k3, lm_head, r, draft.k)


def evaluate(draft: str | os.PathLike[str], *, teacher: str | None = None, prompts: str | None = None,
             data: str | None = None, reference: str | None = None, block_size: int | None = None,
             max_new_tokens: int = 256, batch_size: int = 8, plot: str | os.PathLike[str] | None = None,
             ignore_eos: bool = False, engine: str = "simulated", vllm_python: str | os.PathLike[str] | None = None,
             dtype: str = "float32", markov: bool = True, progress: Progress | None = None) -> EvalResult:
    """Acceptance of a draft with vLLM's definitions: simulated (next to a prompt-lookup drafter) or measured by vLLM.

    Args:
        draft: a k3_dspark or speculators DSpark checkpoint folder.
        teacher: local teacher (target) folder; with `data`, defaults to the manifest's teacher.
        prompts: prompts JSONL (continued greedily by the teacher).
        data: a rollouts folder instead of `prompts` (simulated only; bfloat16 taps, and no tokens past
            its end, so the last step of each sequence can only undercount).
        reference: another draft measured on the same rollouts in the same run (simulated only).
        block_size: k, the drafted tokens per step (default: the speculators `speculative_tokens`,
            or 7 for k3_dspark, the reference draft's).
        max_new_tokens: output tokens per prompt (vLLM's `max_tokens`).
        batch_size: teacher generation batch.
        plot: also write a PNG of acceptance by position there (needs matplotlib; checked first).
        ignore_eos: never stop a request at the teacher's EOS.
        engine: `simulated` or `vllm` (`dspark_hub.train.vllm_eval`).
        vllm_python: the interpreter of a vLLM virtualenv (default: this one, when it has vllm).
        dtype: the vllm engine's dtype (`float32`, `bfloat16`, `float16`); the simulation runs in
            float32, so only a float32 measurement can equal it exactly.
        markov: False drafts without the Markov head (a control; speculators drafts only).
        progress: called per simulated prompt / generated prompt / engine run.

    Raises:
        UsageError: not exactly one of `prompts` and `data`, no teacher, an engine that cannot do
            what was asked, or a draft eval cannot measure.
        MissingDependencyError: `plot` without matplotlib, or `vllm` without vLLM (before any work).
        EngineError: the vLLM engine failed (its log is kept and named).
    """
    if engine not in ENGINES:
        raise UsageError(f"engine {engine!r}; use one of {', '.join(ENGINES)}", param="engine")
    if dtype not in DTYPES:
        raise UsageError(f"dtype {dtype!r}; use one of {', '.join(DTYPES)}", param="dtype")
    if dtype != "float32" and engine != "vllm":
        raise UsageError("the simulation runs in float32; another dtype is for the vllm engine", param="dtype")
    if plot is not None:
        require_matplotlib()   # fail before the long run, not after it
    under_test = read_draft(draft, block_size)
    if engine == "vllm":
        return _evaluate_vllm(under_test, teacher=teacher, prompts=prompts, data=data, reference=reference,
                              max_new_tokens=max_new_tokens, plot=plot, ignore_eos=ignore_eos,
                              vllm_python=vllm_python, dtype=dtype, progress=progress)
    ref_draft = read_draft(reference, under_test.k, param="reference") if reference else None
    if ref_draft is not None and ref_draft.taps != under_test.taps:
        raise UsageError(f"{reference}: taps layers {ref_draft.taps}, the draft {under_test.taps}; a reference is "
                         "measured on the same rollouts, so it needs the same taps", param="reference")
    rollouts, teacher, facts = load_eval_rollouts(under_test, teacher=teacher, prompts=prompts, data=data,
                                                  max_new_tokens=max_new_tokens, batch_size=batch_size,
                                                  progress=progress)
    bounds: dict[str, Any] = {} if data is not None else {"max_tokens": max_new_tokens,
                                                           "stop_ids": stop_token_ids(teacher, ignore_eos)}
    import torch

    announce_stage(progress, "eval: draft", len(rollouts))
    with torch.no_grad():
        result = measure(rollouts, _make_proposer(under_test, teacher, markov=markov), under_test.k, progress,
                         **bounds)
        ref = None if ref_draft is None else measure(rollouts, _make_proposer(ref_draft, teacher, markov=True),
                                                     under_test.k, **bounds)
    harness = {"definition": DEFINITION, "mode": "simulated", "simulation": SIMULATION, "decoding": "greedy",
               "temperature": 0.0, "block_size": under_test.k, "dtype": "float32", "format": under_test.format.name,
               "draft": str(draft), "ignore_eos": ignore_eos, **facts}
    outcome = EvalResult(result, measure_ngram(rollouts, under_test.k, **bounds), harness, ref,
                         str(reference) if reference else None, identify(reference) if reference else None)
    if plot is not None:
        outcome.plot = str(plot_acceptance(outcome, plot))
    return outcome


def _evaluate_vllm(draft: DraftUnderTest, *, teacher: str | None, prompts: str | None, data: str | None,
                   reference: str | None, max_new_tokens: int, plot: str | os.PathLike[str] | None, ignore_eos: bool,
                   vllm_python: str | os.PathLike[str] | None, dtype: str, progress: Progress | None) -> EvalResult:
    from dspark_hub.train import vllm_eval
    from dspark_hub.train.rollouts import read_prompts
    from dspark_hub.train.teacher import chat_template_digest, sha256_file, teacher_identity

    if data is not None:
        raise UsageError("the vllm engine generates its own continuations; pass `prompts` instead", param="data")
    if reference is not None:
        raise UsageError("the vllm engine measures one draft per run; measure the reference in a run of its own",
                         param="reference")
    if prompts is None or teacher is None:
        raise UsageError("the vllm engine needs `prompts` and `teacher`", param="prompts" if prompts is None
                         else "teacher")
    python = vllm_eval.engine_python(vllm_python)       # before any work
    teacher_config = read_teacher_config(teacher)
    refuse_unpaired_teacher(draft, teacher_config, teacher)
    items = read_prompts(prompts, teacher, param="prompts")
    labels = sorted({item.dataset for item in items if item.dataset is not None})
    groups = [[i for i, item in enumerate(items) if item.dataset == label] for label in labels]
    groups += [[i for i, item in enumerate(items) if item.dataset is None]]
    groups = [g for g in groups if g]
    announce_stage(progress, "eval: vLLM, plain then speculative (2 runs of every prompt)", 2 * len(items))
    stops = stop_token_ids(teacher, ignore_eos)
    from dspark_hub.train.vllm_worker import cpu_head_dim_problem

    plain, speculative, python = vllm_eval.measure(teacher, draft.path, [item.input_ids for item in items], groups,
                                                   k=draft.k, max_tokens=max_new_tokens, stop_token_ids=stops,
                                                   python=python, dtype=dtype,
                                                   cpu_refusal=cpu_head_dim_problem(teacher_config, teacher))
    if progress:
        progress(2 * len(items))
    overall, by_dataset = AcceptanceStats(draft.k), {}
    for g, group in enumerate(groups):
        metrics = speculative.metrics(g)
        per_position = [int(v) for v in metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos") or [0] * draft.k]
        stats = AcceptanceStats(draft.k, drafts=int(metrics.get("vllm:spec_decode_num_drafts") or 0),
                                accepted_per_position=per_position,
                                tokens=sum(len(out) for out in speculative.outputs[g]), prompts=len(group))
        overall.add(stats)
        label = items[group[0]].dataset
        if label is not None:
            by_dataset[label] = stats
    report = speculative.report
    measured_by = {key: report[key] for key in ("vllm_version", "untested_version", "torch", "platform",
                                                "speculative_config", "dtype", "model_runner", "triton_interpret",
                                                "async_scheduling", "enable_prefix_caching")}
    measured_by = {"engine": "vllm", **measured_by, "temperature": 0.0, "max_tokens": max_new_tokens,
                   "stop_token_ids": stops, "prompts": len(items), "prompts_sha256": sha256_file(prompts),
                   "python": python, "timing_s": {"plain": plain.report["timing_s"],
                                                  "speculative": report["timing_s"]}}
    identity = teacher_identity(teacher).to_dict()
    harness = {"definition": DEFINITION, "mode": "measured", "decoding": "greedy", "temperature": 0.0,
               "block_size": draft.k, "dtype": report["dtype"], "format": draft.format.name, "draft": draft.path,
               "ignore_eos": ignore_eos, "engine": f"vLLM {report['vllm_version']} ({report['model_runner']} runner"
               + (", Triton interpreter" if report["triton_interpret"] else "") + ")",
               "prompts_sha256": measured_by["prompts_sha256"], "max_new_tokens": max_new_tokens,
               "chat_template_sha256": chat_template_digest(teacher), "teacher": identity["label"],
               "teacher_identity": identity, "data": None}
    outcome = EvalResult(Measurement(overall, by_dataset), None, harness, engine="vllm", measured_by=measured_by,
                         lossless=plain.outputs == speculative.outputs)
    if plot is not None:
        outcome.plot = str(plot_acceptance(outcome, plot))
    return outcome


def require_matplotlib() -> Any:
    """`matplotlib.pyplot` (Agg backend), or a `MissingDependencyError` naming the package."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("needs matplotlib, which is not installed; pip install matplotlib",
                                     param="plot") from exc
    return plt


def plot_acceptance(result: EvalResult, path: str | os.PathLike[str]) -> Path:
    """PNG of per-position acceptance (draft, baseline, reference). Needs matplotlib."""
    plt = require_matplotlib()
    figure, axes = plt.subplots(figsize=(6, 4))
    series = [("draft", result.draft)]
    if result.baseline is not None:
        series.append(("prompt lookup", result.baseline))
    if result.reference is not None:
        series.append(("reference", result.reference))
    for label, measurement in series:
        rates = measurement.overall.per_position
        axes.plot(range(1, len(rates) + 1), rates, marker="o",
                  label=f"{label} (AL {measurement.overall.acceptance_length:.3f})")
    axes.set_xlabel("draft position k")
    axes.set_ylabel("a_k: fraction of steps accepting k drafts")
    axes.set_ylim(0, 1)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return Path(path)
