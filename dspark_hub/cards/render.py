"""Model cards rendered from computed facts: weights (header level), evaluation JSON, training log.

`render_card(meta, ckpt, eval_json, train_log)` renders `templates/model_card.md.j2` from the facts
(`cards.facts.card_facts`), the results tables (`cards.results`) and the card source, through the
environment and sandbox of `cards.templating`; same inputs, same bytes. `card_facts` is importable here too.

Card source (`cards/<name>/card.yaml`; relative paths resolve against its folder): the keys are
`dspark_hub.cards.source.CARD_KEYS`, listed in docs/cards.md and checked key by key when
the file is read. Every string outside `front_matter` is itself a jinja template rendered with
`facts` (CardFacts.to_dict()), `config` (the draft config) and `results`, so numbers in prose are
computed, not typed.

Evaluation JSON (`--eval`), as `dspark-hub eval --json` prints it; extra keys are ignored::

    {"acceptance_length": 1.9, "per_position": [0.5, 0.3, ...],      # overall ("all prompts" row)
     "definition": "acceptance length = 1 + sum of per-position rates",
     "by_dataset": {"HumanEval": {"acceptance_length": 4.96, "per_position": [...]}, ...}
                   | [{"dataset": "HumanEval", ...}, ...],
     "long_context": {"benchmark": "LongBench",
                      "rows": [{"subdomain": "Academic", "context_length": 2000,
                                "per_position": [...], "acceptance_length": 3.09}, ...]},
     "prompts": 32, "tokens": 31744, "baseline": {"per_position": [...], "acceptance_length": ...},
     # harness metadata, top level or under "harness":
     "mode": "teacher-forced" | "served" (or "teacher_forced": bool),
     "decoding": "greedy" (or "greedy": bool, "temperature": 0.0), "block_size": 7,
     "teacher": "org/name@rev" | {"repo", "revision"}, "prompts_sha256": "...",
     "chat_template_sha256": "...", "engine": "...", "hardware": "...",
     # what the numbers are (the label under each acceptance table; `cards.labels.acceptance_label`):
     "measured_by": {"engine": "vllm", "vllm_version": "0.32.0", "dtype": "float32",
                     "prompts_sha256": "...", "speculative_config": {...}},   # a measurement, or
     "mode": "simulated", "simulation": "what was simulated", "k": 4}          # a simulation

Rates are fractions (percentages above 1 are accepted); a missing `acceptance_length` is
computed as 1 + the sum of the rates.

Training log (`--train-log`): JSON lines, as `finetune` writes them. Plain step lines (`step`,
`loss`, the loss terms, `lr`, `accuracy`, `tokens`) become a paragraph in the training section,
with a setup table from the `training_args.json` beside the log (inputs by Hub id or digest;
a local path an older `finetune` recorded is left out). Lines carrying evaluation results become the
"acceptance length by step" table: `{"step": 5400, "loss": ..., "lr": ..., "eval":
{"acceptance_length": 1.887, "loss": 2.379, ...harness keys...}}` (or top-level
`eval_acceptance_length` / `eval_loss`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_hub.cards.facts import NOT_CHECKSUMMED, card_facts, facts_from_metadata, int_or_none, known_digests
from dspark_hub.cards.front_matter import front_matter_problems, front_matter_yaml
from dspark_hub.cards.probe_table import load_probe
from dspark_hub.cards.results import Results, load_eval, load_train_log, load_training_run
from dspark_hub.cards.source import load_card_source
from dspark_hub.cards.templating import TEMPLATE, environment, render_strings, source_environment
from dspark_hub.documents import Document
from dspark_hub.errors import UsageError
from dspark_hub.format.checkpoint import CheckpointView
from dspark_hub.format.provenance import TRAINING_ARGS_NAME
from dspark_hub.format.writer import atomic_file, check_writable, refuse_own_inputs
from dspark_hub.redaction import redact_tokens
from dspark_hub.schemas import command


def _resolve(base: Path, given: str | os.PathLike[str] | None, declared: Any) -> Path | None:
    if given is not None:
        return Path(given)
    return base / str(declared) if declared else None


def collect_results(meta: Mapping[str, Any], base: Path, eval_json: str | os.PathLike[str] | None,
                    train_log: str | os.PathLike[str] | None, probe_json: str | os.PathLike[str] | None = None
                    ) -> Results:
    """Results tables from the eval JSON, training log and probe (arguments win over the card source's paths)."""
    section = meta["results"]
    defaults = section.get("harness") or {}
    eval_path = _resolve(base, eval_json, section.get("eval"))
    results = load_eval(eval_path, defaults=defaults) if eval_path else Results()
    log_path = _resolve(base, train_log, section.get("train_log"))
    if log_path:
        results.by_step, results.by_step_harness, results.by_step_label = load_train_log(log_path, defaults=defaults)
        results.training = load_training_run(log_path)
    probe_path = _resolve(base, probe_json, section.get("probe"))
    if probe_path:
        results.probe = load_probe(probe_path)
    return results


def render_card(meta_yaml_path: str | os.PathLike[str], ckpt: str | os.PathLike[str] | CheckpointView | None = None,
                eval_json: str | os.PathLike[str] | None = None, train_log: str | os.PathLike[str] | None = None, *,
                checksums_from: str | os.PathLike[str] | None = None, hash_files: bool = True,
                progress: Callable[[int], None] | None = None, probe_json: str | os.PathLike[str] | None = None
                ) -> str:
    """Render a model card (README.md text). Deterministic: same inputs, same bytes.

    Args:
        meta_yaml_path: the card source (`cards/<name>/card.yaml`).
        ckpt: the checkpoint folder; without it the card metadata carries the architecture facts.
        eval_json: evaluation JSON (default: `results.eval` of the card source).
        train_log: JSON-lines training log (default: `results.train_log`).
        checksums_from: a manifest of known digests, used instead of hashing those files.
        hash_files: hash checkpoint files the manifest does not cover.
        progress: called with bytes hashed.
        probe_json: `dspark-hub probe --json` output (default: `results.probe`): the conventions checked by
            behaviour.

    Raises:
        UsageError: an input is missing or malformed, or the front matter is invalid.
    """
    meta_path = Path(meta_yaml_path)
    meta = load_card_source(meta_path)
    base = meta_path.parent
    errors = [f"front_matter.{p.key}: {p.message}" for p in front_matter_problems(meta["front_matter"])
              if p.severity == "error"]
    if errors:
        raise UsageError(f"{meta_path}: {errors[0]}; fix the card metadata")
    architecture = meta["architecture"]
    if ckpt is not None:
        manifest = known_digests(checksums_from) if checksums_from else None
        facts = card_facts(ckpt, block_size=int_or_none(architecture.get("block_size")), manifest=manifest,
                           hash_files=hash_files, progress=progress)
    else:
        facts = facts_from_metadata(meta, base)
    results = collect_results(meta, base, eval_json, train_log, probe_json)
    context = {"facts": facts, "config": facts.config, "results": results}
    front_matter = meta["front_matter"]
    card = render_strings({k: v for k, v in meta.items() if k != "front_matter"}, source_environment(), context, "")
    text = environment().get_template(TEMPLATE).render(card=card, front_matter=front_matter,
                                             front_matter_yaml=front_matter_yaml(front_matter), **context)
    return redact_tokens(tidy_markdown(text))   # a card is published: no token, no credentials in a URL


def tidy_markdown(text: str) -> str:
    """One blank line between blocks (outside code fences), no trailing spaces, one final newline.

    Templates compose optional blocks freely; this keeps the output's spacing independent of
    which blocks were present.
    """
    out: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced:
            line = line.rstrip()
            if not line and (not out or not out[-1]):
                continue
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def card_inputs(meta: str | os.PathLike[str], ckpt: str | os.PathLike[str] | None,
                eval_json: str | os.PathLike[str] | None, train_log: str | os.PathLike[str] | None,
                checksums_from: str | os.PathLike[str] | None) -> list[tuple[str, Path | None]]:
    """Every local path `render_card` reads, by argument: the card source and the paths it names too."""
    meta_path = Path(meta)
    source = load_card_source(meta_path)
    base, section = meta_path.parent, source["results"]
    log = _resolve(base, train_log, section.get("train_log"))
    config = (source.get("architecture") or {}).get("config")
    return [("meta", meta_path), ("ckpt", Path(ckpt) if ckpt is not None else None),
            ("eval_json", _resolve(base, eval_json, section.get("eval"))), ("train_log", log),
            ("train_log", log.parent / TRAINING_ARGS_NAME if log else None),
            ("checksums_from", Path(checksums_from) if checksums_from is not None else None),
            ("meta", base / config if isinstance(config, str) else None)]


@dataclass(frozen=True)
class CardResult(Document):
    """What `write_card` wrote: the card at `path`, rendered from the checkpoint `checkpoint` (or its metadata)."""

    SCHEMA = command("card")
    KEYS = ("path", "input=checkpoint", "bytes", "lines", "sha256")

    path: Path
    checkpoint: Path | None
    bytes: int
    lines: int
    sha256: str


def write_card(meta: str | os.PathLike[str], ckpt: str | os.PathLike[str] | None, output: str | os.PathLike[str], *,
               eval_json: str | os.PathLike[str] | None = None, train_log: str | os.PathLike[str] | None = None,
               checksums_from: str | os.PathLike[str] | None = None, hash_files: bool = True, force: bool = False,
               progress: Callable[[int], None] | None = None, probe_json: str | os.PathLike[str] | None = None
               ) -> CardResult:
    """Render a model card (see `render_card`) and write it to `output` atomically.

    Raises:
        RefusedOverwriteError: `output` exists and `force` is False (checked before rendering).
        UsageError: an input is missing or malformed, or the front matter is invalid.
    """
    out = Path(output)
    refuse_own_inputs(out, card_inputs(meta, ckpt, eval_json, train_log, checksums_from), param="output",
                      folder=False, keep=NOT_CHECKSUMMED)
    checked = check_writable(out, force=force)
    text = render_card(meta, ckpt, eval_json, train_log, checksums_from=checksums_from, hash_files=hash_files,
                       progress=progress, probe_json=probe_json)
    data = text.encode("utf-8")
    with atomic_file(out, force=force, checked=checked) as handle:
        handle.write(data)
    return CardResult(path=out, checkpoint=Path(ckpt) if ckpt is not None else None, bytes=len(data),
                      lines=text.count("\n"), sha256=hashlib.sha256(data).hexdigest())
