"""Target rollouts: greedy continuations plus the hidden states a DSpark draft trains on.

`dspark-hub rollouts --target T --prompts P.jsonl --draft-config CKPT/config.json --out DATA`

Prompts (JSONL, one object per line) carry exactly one of:
  - `messages`: a chat, rendered with the target tokenizer's chat template (generation prompt added);
  - `text`: plain text, tokenized by the target tokenizer (its special tokens added);
  - `input_ids`: token ids, used as is (no tokenizer needed);
and optionally `dataset`, a label that evaluation reports separately.

Mode `generate` (the default): each prompt is continued greedily by the target (up to
`max_new_tokens`, stopping at EOS), then one prefill pass over prompt + continuation records the
states. Mode `prefill` (offline data): each line is a whole sequence, recorded as it is, with the
line's optional `loss_mask` (0/1 per token, `input_ids` lines only; all ones when absent).
Per token:

  - `input_ids` (int64 `[T]`);
  - `loss_mask` (uint8 `[T]`): 1 on supervised tokens (the continuation, in `generate` mode);
  - `aux_hidden_states` (bf16 `[T, len(target_layer_ids) * hidden]`): the OUTPUT of each target
    decoder layer named in the draft's `target_layer_ids` (0-based; `hidden_states[l + 1]` in
    `output_hidden_states` indexing, never the final-normed last entry), captured with forward
    hooks and concatenated in ascending id order (see `dspark_hub.target`);
  - `final_hidden_states` (bf16 `[T, hidden]`): the target's last hidden state after its final
    norm, i.e. the input of `lm_head`. Target distributions are recomputed from it at training time.

The target runs in an engine (`dspark_hub.train.target.engines`): `transformers` (default, the oracle)
or `vllm` (the real serving engine; its states equal transformers' to float32 rounding).

Layout of DATA (schema `dspark-hub/rollouts-data/1`; folders written before 0.2 say `dspark-hub/rollouts/1`):
  `shard-NNNNN.safetensors`: tensors named `<prompt_index>.<field>` for the fields above;
  `manifest.json`: `{"schema", "settings": {...}, "target": {...}, "tap_convention", "fields",
  "engine": {...}, "shards": [{"file", "sequences": [{"prompt_index", "dataset", "length", "prompt_length",
  "supervised_tokens", "greedy_agreement": [agree, total]}]}]}`. Every file is written to a temporary sibling and
  renamed; the manifest is rewritten after each shard, so an interrupted run resumes by skipping the
  prompts it already wrote (when the settings match; otherwise it refuses, naming the setting).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_hub import schemas
from dspark_hub._compat import renamed_keywords
from dspark_hub._text import short_json, shortened
from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError, RefusedOverwriteError, UsageError
from dspark_hub.format.contract import CONFIG_NAME
from dspark_hub.format.digests import sha256_file
from dspark_hub.format.folder import check_regular, data_folder
from dspark_hub.format.jsonio import load_json_object, loads_strict, object_or_raise, read_json_input
from dspark_hub.format.taps import TAP_CONVENTION
from dspark_hub.format.writer import atomic_file, atomic_path, refuse_own_inputs
from dspark_hub.progress import Progress, announce_total
from dspark_hub.train.data.checks import (
    FIELD_DTYPES,
    check_mask,
    check_prompt_ids,
    check_rollouts_manifest,
    check_token_ids,
    prompt_kind,
    prompt_lines,
    shard_headers,
)
from dspark_hub.train.data.draft_taps import tap_view
from dspark_hub.train.target.engines import DEFAULT_ENGINE, MODES, EngineOptions, Mode, TargetEngine, open_engine
from dspark_hub.train.target.generate import (  # noqa: F401 (re-exported: the names callers know rollouts by)
    Prompt,
    Rollout,
    generate_rollouts,
    prefill_rollout,
    prefill_rollouts,
)
from dspark_hub.train.target.target import Target
from dspark_hub.train.target.tensors import read_tensors

# safetensors (and torch through it) is imported inside the shard readers and writers: the CLI
# imports this module for `--help`.

#: `manifest.json` and shard metadata of a rollouts folder.
SCHEMA = schemas.ROLLOUTS_DATA
MANIFEST = "manifest.json"
FIELDS = {
    "input_ids": "int64 [T]: prompt then greedy continuation",
    "loss_mask": "uint8 [T]: 1 on supervised tokens (the continuation in generate mode)",
    "aux_hidden_states": "bfloat16 [T, len(target_layer_ids) * hidden]: outputs of the target_layer_ids decoder "
                         "layers (hook on layers[l], = hidden_states[l + 1]), ascending ids, concatenated",
    "final_hidden_states": "bfloat16 [T, hidden]: target hidden after its final norm (lm_head input)",
}


@dataclass(frozen=True)
class RolloutSummary(Document):
    """What `make_rollouts` did."""

    SCHEMA = schemas.command("rollouts")

    path: str
    written: int
    skipped: int
    sequences: int
    continuation_tokens: int
    shards: int
    greedy_agreement: float | None
    engine: str = DEFAULT_ENGINE
    mode: str = "generate"


# ----------------------------------------------------------------------------- prompts


def require_file(path: str | os.PathLike[str], what: str, *, param: str | None = None) -> None:
    """Refuse a path that is no file, in one line: `<path>: not found; pass <what>` (or `is a folder`).

    Raises:
        UsageError: `path` is not a file (`param`: the caller's argument it came from).
    """
    if not Path(path).is_file():
        if Path(path).exists() and not Path(path).is_dir():
            check_regular(path)      # a FIFO, socket or device: named as what it is, never opened
        raise UsageError(f"{path}: {'is a folder' if Path(path).is_dir() else 'not found'}; pass {what}", param=param)


@renamed_keywords(teacher="target")
def read_prompts(path: str | os.PathLike[str], target: str | os.PathLike[str] | Target | None = None, *,
                 param: str | None = None, budget: int = 0) -> list[Prompt]:
    """Parse a prompts JSONL file into token ids (the tokenizer is loaded only if a line needs it).

    `param` names the caller's argument `path` came from, in the errors (e.g. `prompts`). With `target`,
    every prompt's ids must be in its vocabulary and, with `budget` tokens to generate after it, fit its
    context (`data.checks.check_prompt_ids`).

    Raises:
        UsageError: `path` is no file or not UTF-8, or a line is not a prompt (one line naming the file and line).
    """
    tokenizer = None
    prompts: list[Prompt] = []
    require_file(path, "a prompts JSONL file (one messages, text or input_ids object per line)", param=param)
    if target is not None and not isinstance(target, Target) and (Path(target) / CONFIG_NAME).exists():
        target = Target.open(target, param="target")      # once: its limits here, its tokenizer when a line asks
    limits = _target_limits(target)
    for number, line in prompt_lines(path):
        where = f"{path}:{number}"
        try:
            record = object_or_raise(loads_strict(line, path=where), path=where)
        except CheckpointFormatError as exc:
            raise UsageError(f"{exc.message}; one JSON object per line") from None
        kind = prompt_kind(record, where)
        if kind != "input_ids" and tokenizer is None:
            if target is None:
                raise UsageError(f"{where}: {kind} needs the target's tokenizer; pass `target`")
            tokenizer = Target.open(target, param="target").tokenizer(required=True)
        ids = _encode(record, kind, tokenizer, where)
        check_prompt_ids(ids, where, vocab_size=limits[0], context=limits[1], budget=budget)
        mask = record.get("loss_mask")
        if mask is not None and (kind != "input_ids" or not isinstance(mask, list) or len(mask) != len(ids)
                                 or not all(m in (0, 1) and not isinstance(m, bool) for m in mask)):
            raise UsageError(f"{where}: loss_mask must be a list of 0/1, one per input_ids token")
        prompts.append(Prompt(index=len(prompts), input_ids=ids, dataset=record.get("dataset"), loss_mask=mask))
    return prompts


def _target_limits(target: str | os.PathLike[str] | Target | None) -> tuple[int | None, int | None]:
    """(vocabulary size, context length) of an opened target's config, where it states them (a folder without
    config.json, which read_prompts leaves unopened, states neither)."""
    if not isinstance(target, Target):
        return None, None
    config = target.text

    def positive(key: str) -> int | None:
        value = config.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    return positive("vocab_size"), positive("max_position_embeddings")


def _encode(record: dict[str, Any], kind: str, tokenizer: Any, where: str) -> list[int]:
    if kind == "input_ids":
        return list(record["input_ids"])
    if kind == "messages" and not getattr(tokenizer, "chat_template", None):
        raise UsageError("target tokenizer: no chat_template for 'messages' prompts; use text or input_ids")
    try:
        if kind == "text":
            return list(tokenizer(record["text"], add_special_tokens=True)["input_ids"])
        return list(tokenizer.apply_chat_template(record["messages"], add_generation_prompt=True, tokenize=True,
                                                  return_dict=False))
    except Exception as e:   # the tokenizer's own code and chat template (jinja2) raise what they like
        raise UsageError(f"{where}: the target's tokenizer cannot encode the {kind} ({type(e).__name__}: "
                         f"{shortened(str(e).splitlines()[0] if str(e) else '', 120)})") from None


# ----------------------------------------------------------------------------- on disk


def shard_name(number: int) -> str:
    return f"shard-{number:05d}.safetensors"


def write_shard(path: Path, rollouts: Iterable[Rollout]) -> None:
    """Write one shard atomically (temporary sibling, then rename)."""
    from safetensors.torch import save_file

    tensors = {}
    for r in rollouts:
        key = str(r.prompt_index)
        tensors.update({f"{key}.input_ids": r.input_ids.long().contiguous(),
                        f"{key}.loss_mask": r.loss_mask,
                        f"{key}.aux_hidden_states": r.aux_hidden_states.contiguous(),
                        f"{key}.final_hidden_states": r.final_hidden_states.contiguous()})
    with atomic_path(path, force=True) as tmp:
        save_file(tensors, str(tmp), metadata={"schema": SCHEMA})


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    with atomic_file(folder / MANIFEST, force=True, mode="w") as handle:
        handle.write(json.dumps(manifest, indent=2) + "\n")


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        return load_json_object(path)
    except CheckpointFormatError as e:
        raise UsageError(f"{e.message}; write the folder again with 'dspark-hub rollouts --force'") from None


class RolloutData:
    """Read access to a rollouts folder: `len(data)`, `data[i] -> Rollout`.

    The folder follows a model folder's rules (`format.folder.data_folder`), the manifest is checked key by
    key and every shard's header against it (`data.checks`) before anything is read; tensor bytes are read
    through `format.folder.open_regular`, never by a native library opening a path.
    """

    def __init__(self, folder: str | os.PathLike[str], *, param: str | None = None) -> None:
        self.folder = Path(folder)
        path = self.folder / MANIFEST
        if not path.is_file():
            raise UsageError(f"{self.folder}: no {MANIFEST}; pass a folder written by 'dspark-hub rollouts'",
                             param=param)
        listing = data_folder(self.folder)
        self.manifest = _read_manifest(path)
        if schemas.current(self.manifest.get("schema")) != SCHEMA:
            raise UsageError(f"{path}: schema is {short_json(self.manifest.get('schema'), 60)}, expected {SCHEMA!r}")
        self.entries = check_rollouts_manifest(self.manifest, str(path))
        self.settings = self.manifest["settings"]
        self.shards = shard_headers(listing, self.entries, self.settings, str(path))

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> Rollout:
        file, seq = self.entries[i]
        shard, header = self.shards[file]
        key = str(seq["prompt_index"])
        ids, mask, aux, final = read_tensors(shard, header, [f"{key}.{field}" for field in FIELD_DTYPES])
        check_token_ids(ids, self.settings["vocab_size"], f"{shard}: {key}.input_ids")
        check_mask(mask, f"{shard}: {key}.loss_mask")
        return Rollout(seq["prompt_index"], seq.get("dataset"), ids, seq["prompt_length"], aux, final,
                       tuple(seq.get("greedy_agreement", (0, 0))), mask)

    def __iter__(self) -> Iterator[Rollout]:
        return (self[i] for i in range(len(self)))

    @property
    def target_path(self) -> str | None:
        target = self.settings["teacher"]
        return target if isinstance(target, str) and target else None


@renamed_keywords(teacher="target")
def token_counts(data: str | os.PathLike[str], target: str | os.PathLike[str] | Target | None = None, *,
                 param: str | None = None) -> dict[int, int]:
    """How often each token id occurs in `data`: a rollouts folder (the continuations, what a draft predicts)
    or a prompts JSONL file (every prompt token; `target`'s tokenizer encodes text and messages).

    Raises:
        UsageError: `data` is neither (one line naming it).
    """
    from collections import Counter

    counts: Counter[int] = Counter()
    if Path(data).is_dir():
        for rollout in RolloutData(data, param=param):
            counts.update(rollout.input_ids[rollout.prompt_length:].tolist())
    else:
        for prompt in read_prompts(data, target, param=param):
            counts.update(prompt.input_ids)
    return dict(counts)


# ----------------------------------------------------------------------------- the command


def _settings(target: Target, prompts: str | os.PathLike[str], draft: dict[str, Any],
              max_new_tokens: int, ignore_eos: bool, *, mode: Mode = "generate", engine: str = DEFAULT_ENGINE,
              engine_dtype: str = "float32") -> dict[str, Any]:
    return {"teacher": str(target.folder.resolve()), "prompts_sha256": sha256_file(prompts), "mode": mode,
            "max_new_tokens": max_new_tokens if mode == "generate" else 0, "ignore_eos": ignore_eos,
            "decoding": "greedy", "engine": engine, "engine_dtype": engine_dtype,
            "target_layer_ids": list(draft["target_layer_ids"]), "target_hidden_size": draft["target_hidden_size"],
            "target_num_hidden_layers": draft["target_num_hidden_layers"], "vocab_size": draft["vocab_size"]}


#: What a manifest written before a setting existed meant by it.
_SETTING_DEFAULTS = {"mode": "generate", "engine": DEFAULT_ENGINE, "engine_dtype": "float32"}


def _open_manifest(out: Path, settings: dict[str, Any], force: bool) -> dict[str, Any] | None:
    """The manifest to resume from, None to start afresh; refuses foreign or mismatched folders."""
    path = out / MANIFEST
    if not out.exists():
        return None
    if not path.is_file():
        if any(out.iterdir()) and not force:
            raise RefusedOverwriteError(str(out))
        return None
    if force:
        for file in out.glob("shard-*.safetensors"):
            file.unlink()
        return None
    manifest = _read_manifest(path)
    for key, value in settings.items():
        before = manifest.get("settings", {}).get(key, _SETTING_DEFAULTS.get(key))
        if before != value:
            raise RefusedOverwriteError(str(out), f"cannot resume: setting {key} was {before!r} and is now "
                                        f"{value!r}; write to another folder")
    check_rollouts_manifest(manifest, str(path))
    return manifest


@renamed_keywords(teacher="target")
def make_rollouts(target: str | os.PathLike[str] | Target, prompts: str | os.PathLike[str],
                  draft_config: str | os.PathLike[str] | dict[str, Any], out: str | os.PathLike[str], *,
                  max_new_tokens: int, batch_size: int = 8, shard_size: int = 256, ignore_eos: bool = False,
                  force: bool = False, mode: Mode = "generate", engine: str | TargetEngine = DEFAULT_ENGINE,
                  engine_options: EngineOptions | None = None, progress: Progress | None = None) -> RolloutSummary:
    """Write (or resume) a rollouts folder; see the module docstring for the layout.

    Args:
        target: the target (`Target`), or its local transformers causal LM folder.
        prompts: JSONL prompts file.
        draft_config: the draft's `config.json` (path or dict): taps and pairing keys come from it (a
            speculators DSpark's `aux_hidden_state_layer_ids` as our ids, `draft_taps.tap_view`).
        out: output folder.
        max_new_tokens: continuation budget per prompt (`generate` mode).
        batch_size: prompts the transformers engine runs together (equal-length prompts only).
        shard_size: sequences per shard file.
        ignore_eos: continue past EOS (always `max_new_tokens` tokens).
        force: discard existing shards instead of resuming.
        mode: `generate` (greedy continuations) or `prefill` (record the given sequences).
        engine: an engine name from `engines.ENGINES`, or an open engine (left open: on-policy
            rounds reuse it).
        engine_options: settings for a named engine (dtype, vLLM's parallelism and memory options).
        progress: called with the number of prompts finished; told the number still to do first.

    Raises:
        TargetMismatchError: the target does not fit the draft config (one line, naming the key).
        UsageError: malformed prompts, an unknown mode or engine.
        RefusedOverwriteError: `out` holds other files, or a resume whose settings differ (and not `force`).
        MissingDependencyError: the engine's package is not installed.
    """
    if mode not in MODES:
        raise UsageError(f"rollouts mode {mode!r}: use one of {', '.join(MODES)}")
    draft = (draft_config if isinstance(draft_config, dict)
             else read_json_input(draft_config, what="the draft's config.json file", param="draft_config"))
    target = Target.open(target, param="target")
    refuse_own_inputs(out, [("target", target.path), ("prompts", prompts),
                            ("draft_config", None if isinstance(draft_config, dict) else draft_config),
                            ("engine_python", engine_options.python if engine_options else None)],
                      param="out", folder=True)
    # A speculators DSpark's aux ids become our target_layer_ids here (format.taps, through its DraftFormat).
    draft = tap_view(draft, target.config, target=target.path,
                     where="the draft's config" if isinstance(draft_config, dict) else str(draft_config))
    # The inputs are checked before the engine starts (a vLLM start takes seconds to minutes).
    all_prompts = read_prompts(prompts, target, param="prompts", budget=max_new_tokens if mode == "generate" else 0)
    if mode == "generate":
        masked = next((p for p in all_prompts if p.loss_mask is not None), None)
        if masked is not None:
            raise UsageError(f"{prompts}: prompt {masked.index} has a loss_mask, which only prefill mode "
                             "reads (generate mode supervises the continuation)", param="prompts")
    out = Path(out)
    owned = isinstance(engine, str)
    runner = (open_engine(engine, target, list(draft["target_layer_ids"]), engine_options)
              if isinstance(engine, str) else engine)
    try:
        settings = _settings(target, prompts, draft, max_new_tokens, ignore_eos, mode=mode, engine=runner.name,
                             engine_dtype=runner.dtype)
        manifest = _open_manifest(out, settings, force)
        if manifest is None:
            manifest = {"schema": SCHEMA, "settings": settings, "teacher": target.identity.to_dict(),
                        "chat_template_sha256": target.chat_template_sha256, "tap_convention": TAP_CONVENTION,
                        "fields": FIELDS, "shards": []}
        done = {seq["prompt_index"] for shard in manifest["shards"] for seq in shard["sequences"]}
        todo = [p for p in all_prompts if p.index not in done]
        announce_total(progress, len(todo))
        out.mkdir(parents=True, exist_ok=True)
        written = 0
        pending: list[Rollout] = []
        if todo:
            stream = runner.rollouts(todo, mode=mode, max_new_tokens=max_new_tokens, ignore_eos=ignore_eos,
                                     batch_size=batch_size, progress=progress)
            for rollout in stream:
                pending.append(rollout)
                if len(pending) >= shard_size:
                    written += _flush(out, manifest, pending, runner)
            written += _flush(out, manifest, pending, runner)
    finally:
        if owned:
            runner.close()
    return _summary(out, manifest, written, len(all_prompts) - len(todo))


def _flush(out: Path, manifest: dict[str, Any], pending: list[Rollout], engine: TargetEngine) -> int:
    if not pending:
        return 0
    manifest["engine"] = engine.describe()
    name = shard_name(len(manifest["shards"]))
    write_shard(out / name, pending)
    manifest["shards"].append({"file": name, "sequences": [r.entry() for r in pending]})
    write_manifest(out, manifest)
    count = len(pending)
    pending.clear()
    return count


def _summary(out: Path, manifest: dict[str, Any], written: int, skipped: int) -> RolloutSummary:
    sequences = [seq for shard in manifest["shards"] for seq in shard["sequences"]]
    agree = sum(s["greedy_agreement"][0] for s in sequences)
    checked = sum(s["greedy_agreement"][1] for s in sequences)
    settings = manifest.get("settings", {})
    return RolloutSummary(path=str(out), written=written, skipped=skipped, sequences=len(sequences),
                          continuation_tokens=sum(s.get("supervised_tokens", s["length"] - s["prompt_length"])
                                                  for s in sequences),
                          shards=len(manifest["shards"]), greedy_agreement=agree / checked if checked else None,
                          engine=settings.get("engine", DEFAULT_ENGINE), mode=settings.get("mode", "generate"))


@dataclass
class MemoryRollouts:
    """Rollouts held in memory (evaluation without writing a folder)."""

    rollouts: list[Rollout] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rollouts)

    def __getitem__(self, i: int) -> Rollout:
        return self.rollouts[i]

    def __iter__(self) -> Iterator[Rollout]:
        return iter(self.rollouts)
