"""Read evaluation JSON and training logs into the tables a model card renders.

The accepted input shapes are documented in `dspark_hub.cards` (module docstring). Readers
are tolerant: unknown keys are ignored, aliases are accepted, and missing values stay None.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_hub._text import short_json
from dspark_hub.cards.labels import AcceptanceLabel, acceptance_label
from dspark_hub.cards.probe_table import ProbeCheck
from dspark_hub.cards.serving_tables import CalibrationTable, SweepTable, calibration_table, sweep_table
from dspark_hub.cards.values import as_text, first, public_text, read_json
from dspark_hub.errors import CheckpointFormatError, UsageError
from dspark_hub.format.folder import read_regular
from dspark_hub.format.jsonio import load_json_file, loads_strict, object_or_raise
from dspark_hub.format.provenance import TRAINING_ARGS_NAME, describe

#: Harness keys in render order: (label, accepted aliases).
HARNESS_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("definition", ("definition", "metric_definition")),
    ("measurement", ("mode", "measurement")),
    ("decoding", ("decoding", "sampling")),
    ("block size", ("block_size", "num_speculative_tokens", "spec_tokens")),
    ("teacher", ("teacher_identity", "teacher", "teacher_id", "target")),
    ("engine", ("engine", "runtime")),
    ("hardware", ("hardware",)),
    ("prompts", ("prompts", "num_prompts")),
    ("tokens", ("tokens", "num_tokens")),
    ("drafts", ("drafts", "num_drafts")),
    ("accepted per position", ("accepted_per_position",)),
    ("prompt fingerprint", ("prompts_fingerprint", "prompt_fingerprint", "prompts_sha256", "prompt_file_sha256")),
    ("chat template digest", ("chat_template_digest", "chat_template_sha256")),
    ("reference", ("reference",)),
)


@dataclass(frozen=True)
class AcceptanceRow:
    """One row of an acceptance table: its key cells, per-position rates (fractions) and length."""

    key: tuple[str, ...]
    per_position: tuple[float, ...]
    acceptance_length: float


@dataclass
class AcceptanceTable:
    """Per-position acceptance rates, one row per dataset (or sub-domain x context length)."""

    key_headers: tuple[str, ...]
    rows: list[AcceptanceRow]
    harness: list[tuple[str, str]] = field(default_factory=list)
    title: str | None = None
    label: AcceptanceLabel | None = None

    @property
    def positions(self) -> int:
        return max((len(r.per_position) for r in self.rows), default=0)


@dataclass(frozen=True)
class StepRow:
    """Evaluation at one training step."""

    step: int
    acceptance_length: float | None
    eval_loss: float | None


#: `training_args.json` fields a card shows, in order, with their labels.
ARG_LABELS: tuple[tuple[str, str], ...] = (
    ("base", "Base draft"), ("teacher", "Teacher"), ("data", "Training data"), ("prompts", "Prompts"),
    ("eval_data", "Evaluation data"), ("steps", "Steps"), ("epochs", "Epochs"), ("batch_size", "Batch size"),
    ("lr", "Learning rate"), ("min_lr_ratio", "Final learning rate / peak"), ("warmup", "Warmup steps"),
    ("block_size", "Block size"), ("max_anchors", "Anchors per sequence"), ("loss", "Loss weights"),
    ("gamma", "Position decay gamma"), ("alpha", "Confidence loss weight"),
    ("confidence_target", "Confidence head target"), ("clip", "Gradient clipping"),
    ("weight_decay", "Weight decay"), ("dtype", "Precision"), ("seed", "Seed"), ("on_policy", "On-policy"),
    ("rounds", "Rounds"), ("fsdp", "FSDP"),
)
_INPUT_ARGS = ("base", "teacher", "data", "prompts", "eval_data")


@dataclass
class TrainingRun:
    """What a `finetune` log records about the run, and the `training_args.json` beside it."""

    steps: int
    first_step: int
    last_step: int
    tokens: int | None
    first_loss: float | None
    final_loss: float | None
    final_lr: float | None
    final_accuracy: float | None
    terms: list[str]
    setup: list[tuple[str, str]] = field(default_factory=list)

    @property
    def summary(self) -> str:
        """One paragraph: steps, tokens, the loss from first to last step, the final learning rate and accuracy."""
        parts = [f"The training log records {self.steps:,} optimizer step{'s' if self.steps != 1 else ''} "
                 f"({self.first_step:,} to {self.last_step:,})"
                 + (f" over {self.tokens:,} tokens" if self.tokens is not None else "")]
        if self.first_loss is not None and self.final_loss is not None:
            terms = f" ({', '.join(self.terms)})" if self.terms else ""
            parts.append(f"loss{terms} {self.first_loss:.4f} at step {self.first_step:,}, "
                         f"{self.final_loss:.4f} at step {self.last_step:,}")
        if self.final_lr is not None:
            parts.append(f"final learning rate {self.final_lr:.3g}")
        if self.final_accuracy is not None:
            parts.append(f"final draft accuracy {self.final_accuracy:.4f}")
        return "; ".join(parts) + "."


@dataclass
class Results:
    """Everything the results section renders; every part is optional."""

    by_step: list[StepRow] = field(default_factory=list)
    by_step_harness: list[tuple[str, str]] = field(default_factory=list)
    by_step_label: AcceptanceLabel | None = None
    by_dataset: AcceptanceTable | None = None
    long_context: AcceptanceTable | None = None
    sweep: SweepTable | None = None
    calibration: CalibrationTable | None = None
    training: TrainingRun | None = None
    probe: ProbeCheck | None = None

    @property
    def best_step(self) -> int | None:
        scored = [r for r in self.by_step if r.acceptance_length is not None]
        return max(scored, key=lambda r: (r.acceptance_length, r.step)).step if scored else None


def harness_pairs(*sources: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """Harness metadata as (label, text) pairs; earlier sources win, each may nest it under `harness`.

    A teacher or reference named by a local path (`./base`, `teacher`) is shown by its Hub id or
    digests when the file records them, and never by the path (`public_text`).
    """
    merged: dict[str, Any] = {}
    for source in reversed([s for s in sources if s]):
        for scope in (source, source.get("harness") if isinstance(source.get("harness"), Mapping) else {}):
            for label, names in HARNESS_FIELDS:
                value = first(scope, names)
                if value is not None:
                    merged[label] = value
            merged.update(_implied_harness(scope))
    return [(label, public_text(label, merged[label])) for label, _ in HARNESS_FIELDS if label in merged]


def _implied_harness(scope: Mapping[str, Any]) -> dict[str, Any]:
    """Boolean or numeric spellings: `teacher_forced`, `served`, `greedy`, `temperature`."""
    out: dict[str, Any] = {}
    if isinstance(scope.get("teacher_forced"), bool):
        out["measurement"] = "teacher-forced" if scope["teacher_forced"] else "served"
    elif isinstance(scope.get("served"), bool):
        out["measurement"] = "served" if scope["served"] else "teacher-forced"
    temperature = scope.get("temperature")
    if isinstance(scope.get("greedy"), bool) and scope["greedy"]:
        out["decoding"] = "greedy"
    elif isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        out["decoding"] = "greedy" if temperature == 0 else f"temperature {temperature}"
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _rates(values: Any, where: str) -> tuple[float, ...]:
    if not isinstance(values, list) or not all(_is_number(v) for v in values):
        raise UsageError(f"{where}: per_position must be a list of numbers; got {short_json(values, 80)}")
    scale = 100.0 if any(v > 1.0 for v in values) else 1.0   # percentages are accepted too
    if any(not 0 <= v <= scale for v in values):
        raise UsageError(f"{where}: per_position {short_json(values, 80)} holds a rate outside [0, 1] (or [0, 100] "
                         "as percentages); a rate is a fraction of verification steps")
    return tuple(float(v) / scale for v in values)


def _row(key: tuple[str, ...], entry: Mapping[str, Any], where: str) -> AcceptanceRow:
    rates = _rates(entry.get("per_position"), where)
    length = entry.get("acceptance_length")
    if length is None:
        length = 1.0 + sum(rates)      # the definition: 1 + the sum of the per-position rates
    if not _is_number(length) or not 1 <= length <= 1 + len(rates):
        raise UsageError(f"{where}: acceptance_length is {short_json(length, 60)}; it is a number from 1 to "
                         f"{1 + len(rates)} (1 + the sum of the {len(rates)} per-position rates)")
    return AcceptanceRow(key=key, per_position=rates, acceptance_length=float(length))


#: Harness keys that hold counts (`block size`: at least 1), as the eval file spells them.
_COUNTS = {"block_size": 1, "num_speculative_tokens": 1, "spec_tokens": 1, "k": 1, "num_prompts": 0,
           "prompts": 0, "tokens": 0, "num_tokens": 0, "drafts": 0, "num_drafts": 0}


def check_counts(doc: Mapping[str, Any], where: str) -> None:
    """Refuse a count an eval file states (prompts, tokens, drafts, k, accepted per position) that is no whole
    number, or is negative: a card would print it as a fact.

    Raises:
        UsageError: naming the file and key.
    """
    for scope, prefix in ((doc, ""), (doc.get("harness"), "harness.")):
        if not isinstance(scope, Mapping):
            continue
        for key, least in _COUNTS.items():
            value = scope.get(key)
            if value is None or (isinstance(value, str) and key == "prompts"):    # a prompts file's name
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise UsageError(f"{where}: {prefix}{key} is {short_json(value, 60)}; a count is a whole number "
                                 f">= {least}")
        accepted = scope.get("accepted_per_position")
        if accepted is not None and (not isinstance(accepted, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in accepted)):
            raise UsageError(f"{where}: {prefix}accepted_per_position is {short_json(accepted, 80)}; it counts "
                             "drafts, whole numbers >= 0")


def _entries(block: Any, name_keys: tuple[str, ...]) -> list[tuple[str, Mapping[str, Any]]]:
    """`{name: {...}}` or `[{"dataset": name, ...}]` -> [(name, entry)] in file order."""
    if isinstance(block, Mapping):
        return [(str(k), v) for k, v in block.items() if isinstance(v, Mapping)]
    if isinstance(block, list):
        return [(str(first(e, name_keys)), e) for e in block if isinstance(e, Mapping)]
    return []


def _context(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _by_dataset(doc: Mapping[str, Any], where: str, harness: list[tuple[str, str]],
                table_label: AcceptanceLabel | None) -> AcceptanceTable | None:
    rows = [_row((name,), entry, f"{where}:by_dataset.{name}")
            for name, entry in _entries(doc.get("by_dataset"), ("dataset", "name"))
            if entry.get("per_position") is not None]
    if doc.get("per_position") is not None:
        rows.append(_row(("all prompts",), doc, f"{where}:per_position"))
    baseline = doc.get("baseline")
    if isinstance(baseline, Mapping) and baseline.get("per_position") is not None:
        label = str(baseline.get("name") or "prompt-lookup baseline")
        rows.append(_row((label,), baseline, f"{where}:baseline"))
    return AcceptanceTable(key_headers=("Dataset",), rows=rows, harness=harness, label=table_label) if rows else None


def _long_context(doc: Mapping[str, Any], where: str, harness: list[tuple[str, str]],
                  label: AcceptanceLabel | None) -> AcceptanceTable | None:
    block = doc.get("long_context")
    if block is None:
        return None
    rows_in = block.get("rows") if isinstance(block, Mapping) else block
    rows = []
    for i, entry in enumerate(rows_in if isinstance(rows_in, list) else []):
        if not isinstance(entry, Mapping):
            raise UsageError(f"{where}:long_context.rows[{i}]: is {short_json(entry, 60)}, not an object")
        domain = first(entry, ("subdomain", "sub_domain", "domain", "dataset"))
        context = first(entry, ("context_length", "context", "context_tokens"))
        if _is_number(context) and context < 0:
            raise UsageError(f"{where}:long_context.rows[{i}]: context length is {context}; a length is >= 0")
        rows.append(_row((str(domain), _context(context)), entry, f"{where}:long_context.rows[{i}]"))
    title = block.get("benchmark") if isinstance(block, Mapping) else None
    return AcceptanceTable(key_headers=("Sub-domain", "Context"), rows=rows, harness=harness,
                           title=str(title) if title else None, label=label) if rows else None


def _by_context(doc: Mapping[str, Any], where: str, harness: list[tuple[str, str]],
                label: AcceptanceLabel | None) -> AcceptanceTable | None:
    """`eval --by-context`'s rows as the card's long-context table (sub-domain: the dataset, or all prompts)."""
    block = doc.get("by_context")
    rows_in = block.get("rows") if isinstance(block, Mapping) else None
    rows = [_row((str(entry.get("dataset")), str(entry.get("context"))), entry, f"{where}:by_context.rows[{i}]")
            for i, entry in enumerate(rows_in if isinstance(rows_in, list) else []) if isinstance(entry, Mapping)]
    return AcceptanceTable(key_headers=("Sub-domain", "Context"), rows=rows, harness=harness,
                           title="acceptance by context length at the anchor", label=label) if rows else None


def load_eval(path: str | os.PathLike[str], *, defaults: Mapping[str, Any] | None = None) -> Results:
    """Read an evaluation JSON (`dspark-hub eval --json` or the card-side shape) into tables.

    Args:
        path: the JSON file.
        defaults: harness metadata the card source knows; the file's own values win.

    Raises:
        UsageError: the file is missing, not JSON, or a rate list is not numbers.
    """
    p = Path(path)
    doc = read_json(p)
    if not isinstance(doc, Mapping):
        raise UsageError(f"{p}: is a JSON {type(doc).__name__}, not an object; pass 'dspark-hub eval --json' output")
    check_counts(doc, p.name)
    harness = harness_pairs(doc, defaults)
    long_block = doc.get("long_context") if isinstance(doc.get("long_context"), Mapping) else None
    if long_block is not None:
        check_counts(long_block, f"{p.name}:long_context")
    long_harness = harness_pairs(long_block, doc, defaults)
    label = acceptance_label(doc, defaults)
    return Results(by_dataset=_by_dataset(doc, p.name, harness, label),
                   long_context=_long_context(doc, p.name, long_harness, acceptance_label(long_block, doc, defaults))
                   or _by_context(doc, p.name, harness, label),
                   sweep=sweep_table(doc, p.name, label), calibration=calibration_table(doc, p.name, label))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _step_row(line: Mapping[str, Any]) -> StepRow | None:
    evaluation = line.get("eval") if isinstance(line.get("eval"), Mapping) else {}
    length = _number(first(evaluation, ("acceptance_length",))) if evaluation else None
    loss = _number(first(evaluation, ("loss", "eval_loss"))) if evaluation else None
    length = length if length is not None else _number(line.get("eval_acceptance_length"))
    loss = loss if loss is not None else _number(line.get("eval_loss"))
    step = line.get("step")
    if (length is None and loss is None) or not isinstance(step, int) or isinstance(step, bool):
        return None
    return StepRow(step=step, acceptance_length=length, eval_loss=loss)


def _log_lines(path: str | os.PathLike[str]) -> list[Mapping[str, Any]]:
    """The JSON objects of a JSON-lines training log (blank lines skipped).

    Raises:
        UsageError: the file is missing or a line is not a JSON object.
    """
    p = Path(path)
    try:
        lines = read_regular(p).decode("utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{p}: no such file; pass the training log (JSON lines)") from None
    out: list[Mapping[str, Any]] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            out.append(object_or_raise(loads_strict(raw, path=f"{p}:{number}"), path=f"{p}:{number}"))
        except CheckpointFormatError as e:
            raise UsageError(f"{e.message}; each line must be one JSON object") from None
    return out


def load_train_log(path: str | os.PathLike[str], *, defaults: Mapping[str, Any] | None = None
                   ) -> tuple[list[StepRow], list[tuple[str, str]], AcceptanceLabel | None]:
    """Evaluation rows of a JSON-lines training log, by step, plus the eval harness it records and its label.

    Lines without evaluation results (plain training steps) are skipped; a later line for
    the same step replaces an earlier one (a resumed run logs it again).

    Raises:
        UsageError: the file is missing or a line is not a JSON object.
    """
    rows: dict[int, StepRow] = {}
    harness_source: Mapping[str, Any] | None = None
    for line in _log_lines(path):
        row = _step_row(line)
        if row is not None:
            rows[row.step] = row
            if isinstance(line.get("eval"), Mapping):
                harness_source = line["eval"]
    return ([rows[s] for s in sorted(rows)], harness_pairs(harness_source, defaults),
            acceptance_label(harness_source, defaults))


def load_training_run(path: str | os.PathLike[str]) -> TrainingRun | None:
    """The run a `finetune` log records (its plain step lines), with the `training_args.json` beside it.

    None when the log holds no training step (only evaluation lines, say). Inputs recorded as
    local paths by an older `finetune` are left out of the setup: a card never shows a path.

    Raises:
        UsageError: the log is missing or malformed, or `training_args.json` is not a JSON object.
    """
    by_step: dict[int, Mapping[str, Any]] = {}
    for line in _log_lines(path):
        step = line.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and _number(line.get("loss")) is not None:
            by_step[step] = line          # a resumed run logs a step again; the later line wins
    if not by_step:
        return None
    first, last = by_step[min(by_step)], by_step[max(by_step)]
    tokens = [t for t in (line.get("tokens") for line in by_step.values()) if isinstance(t, int)]
    counted = len(tokens) == len(by_step)
    terms = sorted(k for k in last if k in _LOSS_TERMS)
    return TrainingRun(steps=len(by_step), first_step=min(by_step), last_step=max(by_step),
                       tokens=sum(tokens) if counted else None,
                       first_loss=_number(first.get("loss")), final_loss=_number(last.get("loss")),
                       final_lr=_number(last.get("lr")), final_accuracy=_number(last.get("accuracy")),
                       terms=terms, setup=_training_setup(Path(path).parent / TRAINING_ARGS_NAME))


#: Loss terms `finetune` logs per step (`train.objective`).
_LOSS_TERMS = ("ce", "kl", "tv", "confidence")


def _training_setup(path: Path) -> list[tuple[str, str]]:
    """Setup rows from `training_args.json` (none when absent): inputs by Hub id or digest, never a path."""
    if not path.is_file():
        return []
    try:
        args = object_or_raise(load_json_file(path), path=str(path))
    except CheckpointFormatError as e:
        raise UsageError(f"{e.message}; pass the training log that finetune wrote beside it") from None
    rows = []
    for key, label in ARG_LABELS:
        value = args.get(key)
        if value is None or value is False or (key == "rounds" and not args.get("on_policy")):
            continue          # unset, a switch left off, or rounds without on-policy training
        text = describe(value) if key in _INPUT_ARGS else (json.dumps(value) if isinstance(value, dict)
                                                           else as_text(value))
        if text is not None:
            rows.append((label, text))
    return rows
