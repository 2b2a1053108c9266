"""`dspark-hub probe`: which conventions a draft's weights follow, read from what they do on the target's paths.

No tensor shape says which layers a draft was trained to read, which slot predicts which token, whether its last
tap passed the target's final norm, how its `d2t` is read, whether its Markov head carries anything, which block
it was trained for, or (a k3_dspark port) how its RoPE channels pair. Each wrong guess loads and serves; only
acceptance falls. The probe serves the draft every way a convention could be read (`Convention`: the declared
value and its candidates, each a `expected.Reading`) on the same anchors of the target's greedy paths, and names
the value the weights follow by the paired difference in expected accepted drafts per anchor
(`expected.Paired`).

The decision rule (docs/probe.md says why these numbers):

- **The untrained level.** `U` is what the same draft reaches with its trained weights replaced by `init`'s
  random ones (`expected.untrained_like`, seed 0), on the same anchors. The draft is above it when some reading
  reaches `UNTRAINED_RATIO` x `U` with a paired difference of `Z` standard errors; otherwise every convention is
  "cannot tell": differences between readings of an untrained draft are differences between random functions,
  not conventions.
- **A convention.** With `d` the declared value's per-anchor values and `c` a candidate's, the paired difference
  `c - d` has mean `D_c` and standard error `SE_c` (runs of `expected.RUN` consecutive anchors as units). A
  difference counts when it clears `Z` standard errors and is at least `MATERIAL` of what the declared reading
  gained over the untrained level on the same slots. The value is named "as declared" when every candidate is
  worse by a difference that counts; a candidate is named (the weights follow it, the config says otherwise)
  when it beats the declared value by a difference that counts and, if several do, beats each of the others by
  `Z` standard errors; otherwise "cannot tell". One exception: a Markov head whose every bias is zero changes no
  probability at all (`D = SE = 0`), which names "without" exactly, with no statistics to it.

`Z = 4`: a probe makes up to a dozen comparisons per draft, and a false naming is a wrong error in a publish gate;
at 4 standard errors a normal statistic exceeds it by chance with probability 3e-5 each, about 4e-4 over a
dozen. `MATERIAL = 1%`: the standard errors shrink with the anchors, and a barely trained draft's readings
differ systematically by fractions of a percent of its gain (the CI-sized k3_dspark draft: its final-layer tap
normed, +0.13% at z +4.3), while the smallest convention effects measured on trained drafts are 1.5% (a block one
row short) and 4.6% (the Markov head).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dspark_hub import schemas
from dspark_hub.documents import Document
from dspark_hub.errors import UsageError
from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.taps import text_config
from dspark_hub.format.tensorio import tensor_files
from dspark_hub.progress import Progress, announce_stage
from dspark_hub.train.data.draft_taps import tap_view
from dspark_hub.train.evaluation.expected import GreedyPath, Paired, Reading, Scorer, expected_accepted, paired
from dspark_hub.train.evaluation.greedy_paths import greedy_paths
from dspark_hub.train.evaluation.inputs import DraftUnderTest, read_draft
from dspark_hub.train.target.target import Target

if TYPE_CHECKING:
    import torch

#: Standard errors a paired difference must clear to name a value (module docstring).
Z = 4.0
#: How far above the untrained level (a multiple of it) some reading must reach before any convention is judged.
UNTRAINED_RATIO = 2.0
#: The least difference that names a value, as a share of what the draft gained over the untrained level.
MATERIAL = 0.01
#: The prompts the probe continues when given neither prompts nor data (24 chat prompts of six kinds).
DEFAULT_PROMPTS = Path(__file__).with_name("probe_prompts.jsonl")
DEFAULT_NEW_TOKENS = 48
Verdict = Literal["as declared", "other", "cannot tell"]
#: Each convention's finding code in `verify --probe` (an error when the weights follow another value).
CODES = {"taps": "PROBE_TAPS", "slot_layout": "PROBE_SLOT_LAYOUT", "final_norm": "PROBE_FINAL_NORM",
         "d2t": "PROBE_D2T", "markov": "PROBE_MARKOV", "block": "PROBE_BLOCK", "rope": "PROBE_ROPE"}
UNDETERMINED = "PROBE_UNDETERMINED"
CONFIRMED = "PROBE_CONFIRMED"


@dataclass(frozen=True)
class Candidate:
    """One value a convention could take: how it is written, and how the draft is served under it.

    `positions` compares only the first slots (the block sizes: slot 1, which every size has; None: every slot).
    """

    value: str
    reading: Reading
    fix: str | None = None          # what to change when the weights follow this value (the declared: None)
    positions: int | None = None


@dataclass(frozen=True)
class Convention:
    """A convention that applies to the draft: its declared value and the other values it could take."""

    key: str
    title: str
    declared: Candidate
    candidates: tuple[Candidate, ...]
    inert: Candidate | None = None  # named when every candidate behaves exactly as the declared value


@dataclass(frozen=True)
class Score(Document):
    """A candidate's mean expected accepted drafts per anchor, and its paired difference from the declared value."""

    KEYS = ("value", "expected_accepted", "**comparison")
    value: str
    expected_accepted: float
    paired: Paired | None = None

    @property
    def comparison(self) -> dict[str, Any]:
        """The paired difference's keys (`expected.Paired`), null for the declared value itself."""
        if self.paired is None:
            return {"difference": None, "standard_error": None, "z": None, "units": None}
        return self.paired.to_dict()


@dataclass(frozen=True)
class ConventionVerdict(Document):
    """What the probe says about one convention."""

    KEYS = ("key", "title", "declared", "verdict", "follows", "reason", "fix", "candidates=scores")
    key: str
    title: str
    declared: str
    verdict: Verdict
    follows: str | None             # the value the weights follow (None: cannot tell)
    reason: str
    fix: str | None
    scores: tuple[Score, ...]


@dataclass(frozen=True)
class UntrainedLevel(Document):
    """The draft's best reading against the same draft with `init`'s random weights, on the same anchors."""

    KEYS = ("level", "best", "best_expected_accepted=best_value", "ratio", "**paired", "above=trained", "rule")
    level: float                    # U: the untrained draft's expected accepted drafts per anchor
    best: str                       # the reading that reached furthest above it
    best_value: float
    paired: Paired
    trained: bool

    @property
    def ratio(self) -> float | None:
        return self.best_value / self.level if self.level > 0 else None

    @property
    def rule(self) -> str:
        return f"above when a reading reaches {UNTRAINED_RATIO:g} x the level with a paired difference of {Z:g} " \
               "standard errors"


@dataclass
class ProbeResult(Document):
    """What `dspark-hub probe` reports (`to_dict` is the `--json` document); `ok` is False when the weights follow
    a value the config contradicts."""

    SCHEMA = schemas.command("probe")
    KEYS = ("ok", "draft", "format", "target", "k", "data", "paths", "anchors", "untrained", "per_position",
            "conventions", "target_identity", "decision", "settings", "seconds=rounded_seconds")
    draft: str
    format: str
    target: str
    k: int
    paths: int
    anchors: int
    untrained: UntrainedLevel
    per_position: dict[str, list[float]]
    conventions: list[ConventionVerdict]
    data: str
    target_identity: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.contradictions

    @property
    def contradictions(self) -> list[ConventionVerdict]:
        return [c for c in self.conventions if c.verdict == "other"]

    @property
    def decision(self) -> dict[str, Any]:
        """The decision rule's constants and the measure (module docstring)."""
        return {"z": Z, "material": MATERIAL, "untrained_ratio": UNTRAINED_RATIO, "measure": MEASURE}

    @property
    def rounded_seconds(self) -> float:
        return round(self.seconds, 1)


MEASURE = ("expected accepted drafts per anchor, teacher-forced on the target's greedy paths (sum over slots of "
           "the product of the draft's probabilities of the path's tokens); paired differences over the same "
           "anchors, standard errors from runs of 16 consecutive anchors")


# ----------------------------------------------------------------------------- the conventions


def conventions_for(draft: DraftUnderTest, declared: Reading, target_layers: int, weights: set[str]
                    ) -> list[Convention]:
    """Every convention that applies to this draft (its format, taps, vocabulary, heads) on a target of that
    depth, with the candidates each could take."""
    out = [_taps(draft, declared, target_layers)]
    layout = draft.format.anchor_layout_key
    if layout is not None:
        value = bool(draft.config.get(layout, True))
        out.append(Convention("slot_layout", f"slot layout ({layout})", Candidate(json.dumps(value), declared),
                              (Candidate(json.dumps(not value), replace(declared, sample_from_anchor=not value),
                                         f"set {layout} to {json.dumps(not value)}"),)))
    if declared.taps[-1] == target_layers - 1:
        out.append(Convention(
            "final_norm", f"last tap (layer {declared.taps[-1]}, the final layer): its capture",
            Candidate("before the final norm", declared),
            (Candidate("after the final norm", replace(declared, normed_last_tap=True),
                       "the weights were trained on the final layer's state after the target's final norm "
                       "(transformers' hidden_states[-1]); runtimes serve it before the norm (no config key says "
                       "which): train on states captured before the norm (dspark-hub rollouts does) or tap "
                       "another layer"),)))
    if "d2t" in weights:
        out.append(Convention(
            "d2t", "d2t (the pruned vocabulary's map)", Candidate("offsets: target id = i + d2t[i]", declared),
            (Candidate("absolute ids: target id = d2t[i]", replace(declared, d2t="absolute"),
                       "d2t holds absolute target ids; the format stores offsets: write d2t[i] - i"),)))
    if any(name.startswith("markov_head.") for name in weights):
        without = Candidate("without: the body alone", replace(declared, markov=False),
                            "markov_head.* does not carry what the body was trained with (acceptance is as high or "
                            "higher without it): export the trained Markov head")
        out.append(Convention("markov", "Markov head", Candidate("with: the body relies on it", declared),
                              (without,), inert=without))
    out.append(_block(draft, declared))
    if draft.format.rope_pairing is not None:
        out.append(Convention(
            "rope", "RoPE pairing", Candidate(f"{draft.format.rope_pairing}, as the contract says", declared),
            (Candidate("half-split (rotate-half pairs i, i + d/2)", replace(declared, rope="half-split"),
                       "the RoPE rows of q_b_proj and kv_a_proj_with_mqa are in the half-split order: reorder each "
                       "block of qk_rope_head_dim rows so that rows (i, i + d/2) become (2i, 2i + 1)"),)))
    return out


def _taps(draft: DraftUnderTest, declared: Reading, target_layers: int) -> Convention:
    fmt = draft.format
    key = fmt.taps_key

    def written(taps: Sequence[int]) -> str:
        native = fmt.to_native_taps(list(taps))
        return f"{key} {native}" + ("" if native == list(taps) else f" (layer outputs {list(taps)})")

    candidates = []
    for shift, word in ((-1, "one layer earlier"), (1, "one layer later")):
        shifted = [t + shift for t in declared.taps]
        if min(shifted) >= 0 and max(shifted) < target_layers:
            candidates.append(Candidate(f"{word}: {written(shifted)}", replace(declared, taps=tuple(shifted)),
                                        f"set {key} to {fmt.to_native_taps(shifted)}"))
    return Convention("taps", f"tap alignment ({key}, {fmt.title} ids)", Candidate(written(declared.taps), declared),
                      tuple(candidates))


def _block(draft: DraftUnderTest, declared: Reading) -> Convention:
    """Shorter blocks than the served k only: a draft trained for a longer block loses nothing served at k, and
    slot 1 scores higher the longer the block even past the trained size (the CI-sized speculators draft, trained
    for 8: k = 9 beat k = 8 at z > 4 and above the 1% floor), so a longer candidate would name noise."""
    k = declared.block
    serving = draft.format.serving(draft.config)
    trained = draft.format.block_size(draft.config)
    sizes = sorted(b for b in set(range(2, k)) | ({trained} if trained else set()) if b < k)
    return Convention(
        "block", "the block it was trained for",
        Candidate(f"k = {k}", replace(declared, positions=1), positions=1),
        tuple(Candidate(f"k = {b}", replace(declared, block=b, positions=1),
                        f"serve k = {b} (the served k is {k}: {serving.source})", positions=1) for b in sizes))


# ----------------------------------------------------------------------------- the decision


def decide(convention: Convention, values: dict[Candidate, list[torch.Tensor]], untrained: float = 0.0
           ) -> ConventionVerdict:
    """The verdict on one convention from each candidate's per-anchor values and the untrained draft's mean on the
    same slots (module docstring)."""
    declared = values[convention.declared]
    floor = MATERIAL * max(0.0, _mean(declared) - untrained)
    scores = [Score(convention.declared.value, _mean(declared))]
    comparisons = {}
    for candidate in convention.candidates:
        comparison = paired(declared, values[candidate])
        comparisons[candidate] = comparison
        scores.append(Score(candidate.value, _mean(values[candidate]), comparison))

    def verdict(kind: Verdict, follows: Candidate | None, reason: str) -> ConventionVerdict:
        fix = follows.fix if kind == "other" and follows is not None else None
        return ConventionVerdict(convention.key, convention.title, convention.declared.value, kind,
                                 None if follows is None else follows.value, reason, fix, tuple(scores))

    if not comparisons:
        return verdict("cannot tell", None, "no other value applies to this draft")
    if convention.inert is not None and all(c.identical for c in comparisons.values()):
        return verdict("other", convention.inert, "every candidate gives exactly the declared value's probabilities "
                                                  "at every anchor: the head changes nothing")
    better = [c for c, p in comparisons.items() if p.z > Z and p.mean >= floor]
    if better:
        best = max(better, key=lambda c: comparisons[c].mean)
        rivals = [c for c in better if c is not best]
        if all(paired(values[rival], values[best]).z > Z for rival in rivals):
            p = comparisons[best]
            return verdict("other", best, f"{best.value} beats the declared value by {_text(p)}")
        return verdict("cannot tell", None, f"{', '.join(c.value for c in better)} each beat the declared value, "
                                            f"and do not separate from each other by {Z:g} standard errors")
    if all(p.z < -Z and -p.mean >= floor for p in comparisons.values()):
        worst = max(comparisons.values(), key=lambda p: p.z)
        return verdict("as declared", convention.declared,
                       f"every other value is worse, the closest by {_text(replace(worst, mean=-worst.mean))}")
    close = [c for c, p in comparisons.items() if p.z >= -Z or -p.mean < floor]
    return verdict("cannot tell", None, f"{', '.join(c.value for c in close)} within {Z:g} standard errors or "
                                        f"{MATERIAL:.0%} of the draft's gain over the untrained level of the declared "
                                        "value")


def _text(p: Paired) -> str:
    return f"{p.mean:+.5f} expected accepted per anchor (standard error {p.standard_error:.5f}, z {p.z:+.1f})"


def _mean(values: Sequence[torch.Tensor]) -> float:
    import torch

    return float(torch.cat(list(values)).mean())


def untrained_level(readings: dict[str, list[torch.Tensor]], untrained: list[torch.Tensor]) -> UntrainedLevel:
    """The draft's best reading against the untrained draft (module docstring)."""
    level = _mean(untrained)
    comparisons = {name: paired(untrained, values) for name, values in readings.items()}
    means = {name: _mean(values) for name, values in readings.items()}
    best = max(readings, key=lambda name: comparisons[name].z)
    above = [name for name in readings
             if means[name] >= UNTRAINED_RATIO * level and comparisons[name].z > Z]
    if above:
        best = max(above, key=lambda name: means[name])
    return UntrainedLevel(level, best, means[best], comparisons[best], bool(above))


def cannot_tell_all(conventions: list[Convention], values: dict[Candidate, list[torch.Tensor]],
                    level: UntrainedLevel) -> list[ConventionVerdict]:
    """Every convention "cannot tell": the draft's acceptance is at the untrained level."""
    reason = (f"the draft is at the untrained level: its best reading ({level.best}) reaches "
              f"{level.best_value:.5f} expected accepted per anchor against {level.level:.5f} with init's random "
              f"weights (needs {UNTRAINED_RATIO:g} x and {Z:g} standard errors)")
    out = []
    for convention in conventions:
        scores = [Score(convention.declared.value, _mean(values[convention.declared]))]
        scores += [Score(c.value, _mean(values[c]), paired(values[convention.declared], values[c]))
                   for c in convention.candidates]
        out.append(ConventionVerdict(convention.key, convention.title, convention.declared.value, "cannot tell",
                                     None, reason, None, tuple(scores)))
    return out


# ----------------------------------------------------------------------------- the probe


@dataclass
class Plan:
    """What one probe serves: the draft, its target (opened once), the conventions that apply and every reading."""

    draft: DraftUnderTest
    target: Target
    target_layers: int
    scorer: Scorer
    conventions: list[Convention]
    declared: Reading
    untrained: Reading

    @property
    def candidates(self) -> list[Candidate]:
        return [c for conv in self.conventions for c in (conv.declared, *conv.candidates)]

    @property
    def readings(self) -> list[Reading]:
        return list(dict.fromkeys([self.declared, self.untrained, *(c.reading for c in self.candidates)]))

    @property
    def layers(self) -> set[int]:
        """Every target layer a reading taps: what the target's paths must hold."""
        return {t for r in self.readings for t in r.taps}

    @property
    def longest(self) -> int:
        return max(r.block for r in self.readings)


def plan_probe(draft: str | os.PathLike[str], target: Target, *, block_size: int | None = None) -> Plan:
    """The conventions that apply to the draft and the readings that test them (nothing runs yet).

    Raises:
        UsageError: a draft eval cannot measure, or taps outside the target.
        TargetMismatchError: the target does not pair with the draft.
    """
    under_test = read_draft(draft, block_size)
    tap_view(under_test.config, target.config, where=f"{under_test.path}/{CONFIG_NAME}", target=target.path,
             param="draft")
    layers = int(text_config(target.config)["num_hidden_layers"])
    scorer = Scorer.open(under_test, target)
    declared = scorer.declared()
    conventions = conventions_for(under_test, declared, layers, set(tensor_files(under_test.path)))
    return Plan(under_test, target, layers, scorer, conventions, declared, replace(declared, untrained=True))


def judge(plan: Plan, paths: Sequence[GreedyPath], *, data: str = "", progress: Progress | None = None
          ) -> ProbeResult:
    """Serve every reading of `plan` on `paths` (which must hold `plan.layers`) and decide each convention.

    Raises:
        UsageError: no path is longer than the longest block.
    """
    started = time.perf_counter()
    longest = plan.longest
    if not any(len(p.anchors(longest)) for p in paths):
        raise UsageError(f"no anchor: the paths are shorter than {longest + 1} tokens past their prompts",
                         param="data")
    announce_stage(progress, "probe: readings", len(plan.readings))
    slots = plan.scorer.slot_values(paths, plan.readings, progress)
    values = {c: _expected(slots[c.reading], c.positions) for c in plan.candidates}
    full = {c.value: values[c] for c in plan.candidates if c.positions is None}
    level = untrained_level(full, _expected(slots[plan.untrained], None))
    untrained_on = {positions: _mean(_expected(slots[plan.untrained], positions))
                    for positions in {c.declared.positions for c in plan.conventions}}
    verdicts = ([decide(conv, values, untrained_on[conv.declared.positions]) for conv in plan.conventions]
                if level.trained else cannot_tell_all(plan.conventions, values, level))
    per_position = {"draft": _per_position(slots[plan.declared]), "untrained": _per_position(slots[plan.untrained])}
    return ProbeResult(plan.draft.path, plan.draft.format.name, str(plan.target.path), plan.draft.k, len(paths),
                       sum(len(p.anchors(longest)) for p in paths), level, per_position, verdicts, data=data,
                       target_identity=plan.target.identity.to_dict(), seconds=time.perf_counter() - started,
                       settings={"block_size": plan.draft.k, "target_layers": plan.target_layers})


def probe(draft: str | os.PathLike[str], *, target: str | os.PathLike[str] | None = None,
          prompts: str | os.PathLike[str] | None = None, data: str | os.PathLike[str] | None = None,
          block_size: int | None = None, max_new_tokens: int = DEFAULT_NEW_TOKENS, batch_size: int = 16,
          progress: Progress | None = None) -> ProbeResult:
    """Which conventions the draft's weights follow, from its behaviour on the target's greedy paths.

    The target runs once: its paths hold every layer any reading taps (`plan_probe`), and every reading is a
    choice of their columns (`judge`).

    Args:
        draft: a k3_dspark or speculators DSpark folder.
        target: the target folder (with `data`, defaults to the rollouts' target).
        prompts: a prompts JSONL file continued greedily by the target (default: `DEFAULT_PROMPTS`).
        data: a rollouts folder instead: its sequences as they are (the target's states are captured again, at
            every layer a reading taps).
        block_size: the served k (default: the speculators `speculative_tokens`, 7 for k3_dspark).
        max_new_tokens: anchors per prompt (each path is continued that many tokens plus the longest block).
        batch_size: prompts the target continues together.
        progress: called per path made.

    Raises:
        UsageError: both `prompts` and `data`, no target, a draft eval cannot measure, taps outside the target.
        TargetMismatchError: the target does not pair with the draft.
    """
    started = time.perf_counter()
    if prompts is not None and data is not None:
        raise UsageError("pass at most one of `prompts` and `data`", param="data")
    plan = plan_probe(draft, _target(target, data), block_size=block_size)
    source = prompts if prompts is not None or data is not None else DEFAULT_PROMPTS
    paths = greedy_paths(plan.target, plan.layers, prompts=None if data else source, data=data,
                         max_new_tokens=max_new_tokens + plan.longest, batch_size=batch_size, progress=progress)
    result = judge(plan, paths, data=str(data if data is not None else source), progress=progress)
    result.seconds = time.perf_counter() - started
    result.settings["max_new_tokens"] = max_new_tokens
    return result


def _target(target: str | os.PathLike[str] | None, data: str | os.PathLike[str] | None) -> Target:
    if target is not None:
        return Target.open(target, param="target")
    if data is None:
        raise UsageError("needs `target`", param="target")
    from dspark_hub.train.data.rollouts import RolloutData

    folder = RolloutData(data, param="data").target_path
    if folder is None:
        raise UsageError(f"{data}: the manifest names no target; pass `target`", param="target")
    return Target.open(folder, param="target")


def _expected(slots: list[torch.Tensor], positions: int | None) -> list[torch.Tensor]:
    return [expected_accepted(q if positions is None else q[:, :positions]) for q in slots]


def _per_position(slots: list[torch.Tensor]) -> list[float]:
    """Per position i, the mean over anchors of the probability that slots 1..i are all accepted."""
    import torch

    return [round(float(v), 6) for v in torch.cumprod(torch.cat(slots), dim=-1).mean(0)]
