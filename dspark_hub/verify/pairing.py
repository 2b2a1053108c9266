"""`verify --target TARGET`: does this draft pair with that target? Offline, from files only.

What the draft says about its target comes from its draft format (`format.registry.PairingKeys`):
k3_dspark's ``target_hidden_size``, ``target_num_hidden_layers``, ``vocab_size`` and
``target_layer_ids``; a speculators DSpark's ``target_hidden_size`` (null: the hidden size),
``transformer_layer_config.vocab_size``, ``draft_vocab_size`` and ``aux_hidden_state_layer_ids``
(residual indices, shown in our convention too; it records no target layer count).

Checks (each a finding naming what differs):

- the target's hidden size, layer count (where the draft records one) and vocabulary against the
  draft's, the rows of the target's embedding table (a padded vocabulary breaks the shared
  ``lm_head``), and a draft vocabulary no larger than the target's;
- every tap in range for the target (k3_dspark: ``target_layer_ids`` in ``[0, L)``, never the final
  layer; speculators: aux ids in ``[0, L]``);
- the verifier a speculators draft records (``speculators_config.verifier.architectures``) against
  the target's architectures (a warning);
- ``mask_token_id`` inside the target vocabulary, not the target's pad/eos id, and, when the
  target ships a tokenizer (``tokenizer.json``, ``tokenizer_config.json``
  ``added_tokens_decoder``, ``special_tokens_map.json``, read as JSON, never run), a special
  or reserved token rather than ordinary text;
- k3_dspark only: ``embed_tokens.weight`` identical to the target's embedding, compared in the
  draft's dtype: raw bytes when the dtypes agree; a target stored in F32 or F16 (a transformers
  ``save_pretrained`` of a small model) is cast exactly to the draft's BF16 (round to nearest even,
  what the runtime does when it loads the target in BF16) and compared with that. Streamed SHA-256
  of both byte ranges through the `Source` protocol (one read of the target), so it works for local
  folders and Hub sources alike; a speculators draft saves no embedding;

and records what the draft was paired with in ``sections["pairing"]``::

    {"target": str, "revision": str|null, "revision_source": str|null, "format": str,
     "draft": {"tap_width", "vocab_size", "draft_vocab_size", "target_layers", "target_layer_ids",
               "native_layer_ids", "native_layer_ids_key", "verifier"},   # target_layer_ids: our convention
     "config": {"hidden_size", "num_hidden_layers", "vocab_size", "sha256"},
     "files": {name: {"size": int, "sha256": str|null}},   # config/tokenizer files hashed, weights by size
     "embedding": {"draft": digest|null, "target": digest|null,      # digests of the bytes as stored
                   "target_cast": digest|null,   # the target's values cast to the draft's dtype, when they differ
                   "compared_as": "bytes"|"cast"|null,   # bytes: same dtype; cast: exact RNE of the target
                   "identical": bool|null, "verdict": str|null}|null,   # verdict: e.g. "identical after BF16
                                                 # rounding (nearest even) of the F32 target"
     "mask_token": {"id", "content", "special", "where"}|null}

TARGET may be a local folder or ``hf://org/name[@rev]`` (through `format.remote.source_for`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dspark_hub.documents import Document
from dspark_hub.errors import CheckpointFormatError, HubError, UsageError, about
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import CheckpointView, Source, open_checkpoint, read_at_most
from dspark_hub.format.jsonio import is_int, loads_strict
from dspark_hub.format.registry import DEFAULT_FORMAT, PairingKeys
from dspark_hub.format.remote import source_for
from dspark_hub.format.taps import text_config
from dspark_hub.format.tensorio import CastDigest, TensorDigest, digest_as
from dspark_hub.progress import Progress
from dspark_hub.report import (
    FileSizeDigest,
    Finding,
    PairedEmbedding,
    PairingSection,
    Report,
    error,
    info,
    warning,
)
from dspark_hub.verify.embedding import compare_embeddings
from dspark_hub.verify.family import detect

CHUNK_BYTES = 16 << 20
#: Where a target checkpoint keeps its input embedding (plain, HF causal-LM, multimodal wrappers).
TARGET_EMBED_NAMES = contract.TARGET_EMBED_NAMES
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_RESERVED = re.compile(r"reserved|mask|<\|.*\|>|^\[.*\]$|^<.*>$", re.IGNORECASE)
_HF_METADATA = ".cache/huggingface/download/config.json.metadata"
_SNAPSHOT = re.compile(r"snapshots/([0-9a-f]{40})(?:/|$)")


def source_pieces(source: Source, name: str, start: int, end: int, *, progress: Progress | None = None,
                  chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Bytes [start, end) of one file of a `Source`, in fixed-size reads.

    Raises:
        OSError: the file ends before `end`.
    """
    pos = start
    while pos < end:
        piece = source.read_bytes(name, pos, min(chunk_bytes, end - pos))
        if not piece:
            raise OSError(errno.EIO, f"ends {end - pos:,} bytes before offset {end:,}; the file is truncated", name)
        pos += len(piece)
        if progress:
            progress(len(piece))
        yield piece


def hash_source_range(source: Source, name: str, start: int, end: int, *, progress: Progress | None = None,
                      chunk_bytes: int = CHUNK_BYTES) -> str:
    """SHA-256 of bytes [start, end) of one file of a `Source`, streamed in fixed-size reads.

    Raises:
        OSError: the file ends before `end`.
    """
    hasher = hashlib.sha256()
    for piece in source_pieces(source, name, start, end, progress=progress, chunk_bytes=chunk_bytes):
        hasher.update(piece)
    return hasher.hexdigest()


def tensor_digest(view: CheckpointView, name: str, *, progress: Progress | None = None,
                  as_dtype: str | None = None) -> CastDigest | None:
    """Hash one tensor of an opened checkpoint in place (None when it is absent).

    `as_dtype`: also hash the values cast exactly to that dtype (`tensorio.EXACT_CASTS`), in the same read.
    """
    if name not in view.tensors:
        return None
    file, tinfo = view.tensors[name]
    start, end = view.headers[file].absolute_range(name)
    stored = TensorDigest(location=f"{view.location}/{file}:{name}", dtype=tinfo.dtype, shape=tuple(tinfo.shape),
                          nbytes=end - start, sha256="")
    return digest_as(source_pieces(view.source, file, start, end, progress=progress), stored, as_dtype)


# ---------------------------------------------------------------- target facts

def target_embedding_name(view: CheckpointView) -> str | None:
    return next((n for n in TARGET_EMBED_NAMES if n in view.tensors), None)


def _read_json(view: CheckpointView, name: str) -> object:
    if name not in view.files:
        return None
    try:
        data = read_at_most(view.source, name, view.files[name], contract.MAX_JSON_BYTES)
        return loads_strict(data, path=name) if data is not None else None
    except HubError:
        raise   # the Hub failed, not the file
    except (CheckpointFormatError, OSError):
        return None


def _sha256_file(view: CheckpointView, name: str) -> str:
    return hash_source_range(view.source, name, 0, view.files[name])


def target_revision(view: CheckpointView) -> tuple[str | None, str | None]:
    """The target's commit, when the source knows it: a Hub source, an HF cache snapshot, or `hf download`."""
    commit = getattr(view.source, "commit", None)      # hub.HubSource resolves the revision to a commit
    if isinstance(commit, str) and commit:
        return commit, "hub"
    match = _SNAPSHOT.search(os.fspath(getattr(view.source, "root", view.location)).replace(os.sep, "/") + "/")
    if match:
        return match.group(1), "hf cache snapshot path"
    root = getattr(view.source, "root", None)
    if root is not None and (root / _HF_METADATA).is_file():
        first = (root / _HF_METADATA).read_text(errors="replace").splitlines()[:1]
        if first and re.fullmatch(r"[0-9a-f]{40}", first[0].strip()):
            return first[0].strip(), "hf download --local-dir metadata"
    return None, None


# ---------------------------------------------------------------- mask token

@dataclass(frozen=True)
class TokenInfo(Document):
    id: int
    content: str
    special: bool | None
    where: str


def find_token(view: CheckpointView, token_id: int) -> TokenInfo | None:
    """What the target's tokenizer files say token `token_id` is (JSON only; no tokenizer code runs)."""
    config = _read_json(view, "tokenizer_config.json")
    if isinstance(config, Mapping):
        entry = (config.get("added_tokens_decoder") or {}).get(str(token_id))
        if isinstance(entry, Mapping) and isinstance(entry.get("content"), str):
            return TokenInfo(token_id, entry["content"], entry.get("special"), "tokenizer_config.json")
    doc = _read_json(view, "tokenizer.json")
    if isinstance(doc, Mapping):
        for entry in doc.get("added_tokens") or []:
            if isinstance(entry, Mapping) and entry.get("id") == token_id:
                return TokenInfo(token_id, str(entry.get("content")), entry.get("special"), "tokenizer.json")
        vocab = (doc.get("model") or {}).get("vocab")
        if isinstance(vocab, Mapping):
            for content, tid in vocab.items():
                if tid == token_id:
                    return TokenInfo(token_id, content, False, "tokenizer.json model.vocab")
    return None


def _special_strings(view: CheckpointView) -> set[str]:
    out: set[str] = set()
    doc = _read_json(view, "special_tokens_map.json")
    if isinstance(doc, Mapping):
        for value in doc.values():
            for item in value if isinstance(value, list) else [value]:
                text = item.get("content") if isinstance(item, Mapping) else item
                if isinstance(text, str):
                    out.add(text)
    return out


def _mask_findings(mask: int | None, tcfg: Mapping[str, Any], view: CheckpointView,
                   vocab: int | None) -> tuple[list[Finding], TokenInfo | None]:
    where = "config.json:mask_token_id"
    if mask is None:
        return [], None
    if vocab is not None and not 0 <= mask < vocab:
        return [error("PAIRING_MASK_TOKEN", where, f"mask_token_id {mask} is outside the target's vocabulary "
                      f"[0, {vocab}); the draft embeds a row the target does not have",
                      "use a reserved id of the target's vocabulary")], None
    out: list[Finding] = []
    for key in ("pad_token_id", "eos_token_id"):
        ids = tcfg.get(key)
        if mask == ids or (isinstance(ids, list) and mask in ids):
            out.append(error("PAIRING_MASK_TOKEN", where, f"mask_token_id {mask} is the target's {key}; "
                             "training and serving then confuse the mask with real text",
                             "use a reserved id the target never generates"))
    if not any(name in view.files for name in TOKENIZER_FILES):
        return out, None
    token = find_token(view, mask)
    if token is None:
        out.append(warning("PAIRING_MASK_UNNAMED", where, f"the target's tokenizer files do not name token {mask}",
                           "check that the id is a reserved token of the target's tokenizer"))
        return out, None
    special = token.special is True or token.content in _special_strings(view)
    if not special and not _RESERVED.search(token.content):
        out.append(error("PAIRING_MASK_TOKEN", where, f"mask_token_id {mask} is ordinary text in the target's "
                         f"tokenizer ({token.content!r}, {token.where}); the draft's mask slots look like that text",
                         "use a special or reserved token"))
    return out, token


# ---------------------------------------------------------------- shape facts

def _compare(mine: object, draft_key: str, target: Mapping[str, Any], target_key: str,
             code: str, what: str, why: str) -> list[Finding]:
    theirs = target.get(target_key)
    if theirs is None or mine == theirs:
        return []
    return [error(code, f"config.json:{draft_key}", f"{draft_key} is {json.dumps(mine)} but the target's "
                  f"{target_key} is {json.dumps(theirs)} ({what}); {why}",
                  "pair the draft with the target it was trained on")]


def _not_a_target(tcfg: Mapping[str, Any], vocab: object, location: str) -> list[Finding]:
    """A target must say what the draft pairs against; a draft passed as its own target says nothing."""
    missing = [key for key, value in (("hidden_size", tcfg.get("hidden_size")),
                                      ("num_hidden_layers", tcfg.get("num_hidden_layers")),
                                      ("vocab_size", vocab)) if not is_int(value)]
    if not missing:
        return []
    return [error("PAIRING_NOT_A_TARGET", f"{location}/config.json", f"the target's config has no "
                  f"{' or '.join(missing)}, so the draft cannot be paired with it",
                  "pass the target model's folder (the model the draft speculates for), not a draft")]


def _vocab_findings(keys: PairingKeys, tcfg: Mapping[str, Any], rows: int | None) -> list[Finding]:
    out = _compare(keys.vocab_size, keys.vocab_key, tcfg, "vocab_size", "PAIRING_VOCAB", "vocabulary",
                   "the draft scores through the target's lm_head, so the vocabularies must be identical")
    vocab = keys.vocab_size
    if rows is not None and isinstance(vocab, int) and rows != vocab and rows != tcfg.get("vocab_size"):
        out.append(error("PAIRING_VOCAB", f"config.json:{keys.vocab_key}", f"the target's embedding has {rows} rows "
                         f"(vocabulary with padding) but the draft's {keys.vocab_key} is {vocab}; runtimes then stop "
                         "sharing the lm_head (0% acceptance in a public vLLM report)",
                         "give the draft the target's padded vocabulary size"))
    theirs = tcfg.get("vocab_size") if isinstance(tcfg.get("vocab_size"), int) else rows
    draft_vocab = keys.draft_vocab_size
    if draft_vocab is not None and theirs is not None and draft_vocab > theirs:
        out.append(error("PAIRING_VOCAB", "config.json:draft_vocab_size", f"draft_vocab_size {draft_vocab} is larger "
                         f"than the target's vocabulary {theirs}", "a draft vocabulary is the target's or a subset"))
    return out


def _verifier_findings(keys: PairingKeys, target_config: Mapping[str, Any]) -> list[Finding]:
    """The verifier the draft records (speculators `speculators_config.verifier`) against the target's architecture."""
    recorded, theirs = keys.verifier_architectures, target_config.get("architectures")
    if not recorded or not isinstance(theirs, list) or set(recorded) & set(theirs):
        return []
    return [warning("PAIRING_VERIFIER", "config.json:speculators_config.verifier", f"the draft was trained against "
                    f"{keys.verifier or 'a verifier'} with architectures {recorded}; this target is {theirs}",
                    "check that this is the model the draft was trained for")]


def _embedding(draft_view: CheckpointView, target_view: CheckpointView, name: str | None,
               progress: Progress | None) -> tuple[list[Finding], PairedEmbedding]:
    mine = tensor_digest(draft_view, contract.FROZEN_TENSORS[0], progress=progress)
    theirs = (tensor_digest(target_view, name, progress=progress, as_dtype=mine.stored.dtype if mine else None)
              if name else None)
    comparison = compare_embeddings(mine.stored if mine else None, theirs)
    section: PairedEmbedding = {"draft": mine.stored.to_dict() if mine else None,
               "target": theirs.stored.to_dict() if theirs else None, **comparison.to_dict()}
    out: list[Finding] = []
    if theirs is None:
        out.append(warning("PAIRING_NO_TARGET_EMBEDDING", target_view.location, "the target holds none of "
                           f"{', '.join(TARGET_EMBED_NAMES)}; embed_tokens could not be compared"))
    elif comparison.identical is False:
        out.append(error("PAIRING_EMBEDDING", contract.FROZEN_TENSORS[0],
                         f"is not {comparison.sameness} the target's {name} ({comparison.evidence})",
                         "copy the target's embedding unchanged (a new draft: 'dspark-hub init DIR --embed-from "
                         "TARGET'); the draft shares it frozen"))
    return out, section


def _file_digests(view: CheckpointView, hashed: tuple[str, ...]) -> dict[str, FileSizeDigest]:
    """Config/tokenizer files hashed here; weight files by size, plus the Hub's LFS SHA-256 when remote."""
    remote = view.source.remote_files() if hasattr(view.source, "remote_files") else {}
    out: dict[str, FileSizeDigest] = {}
    for name, size in view.files.items():
        if name in hashed:
            out[name] = {"size": size, "sha256": _sha256_file(view, name)}
        elif name in view.headers or name == contract.INDEX_NAME:
            out[name] = {"size": size, "sha256": getattr(remote.get(name), "sha256", None)}
    return out


# ---------------------------------------------------------------- entry point

def check_pairing(draft_view: CheckpointView, target_view: CheckpointView, *,
                  progress: Progress | None = None) -> tuple[list[Finding], PairingSection]:
    """Every pairing check of a draft against a target; returns findings and `sections["pairing"]`.

    What the draft says about its target comes from its format's `pairing_keys` (`format.registry`):
    `target_hidden_size`/`target_num_hidden_layers`/`vocab_size` for k3_dspark; `target_hidden_size`
    (null: the hidden size), `transformer_layer_config.vocab_size`, `draft_vocab_size` and the aux ids
    (converted to our convention) for a speculators DSpark, which records no target layer count.
    """
    draft = draft_view.config or {}
    if target_view.config is None:
        raise UsageError(f"{target_view.location}: no readable config.json; pass the target model folder",
                         param="target")
    fmt, _ = detect(draft, draft_view.tensors)
    fmt = fmt or DEFAULT_FORMAT
    keys = fmt.pairing_keys(draft)
    tcfg = text_config(target_view.config)
    embed_name = target_embedding_name(target_view)
    rows = target_view.tensors[embed_name][1].shape[0] if embed_name else None
    vocab = tcfg.get("vocab_size") if isinstance(tcfg.get("vocab_size"), int) else rows
    out = _not_a_target(tcfg, vocab, target_view.location)
    out += _compare(keys.tap_width, keys.tap_width_key, tcfg, "hidden_size", "PAIRING_HIDDEN_SIZE", "hidden size",
                   "the draft's context projection expects taps of that width")
    if keys.target_layers_key is not None:
        out += _compare(keys.target_layers, keys.target_layers_key, tcfg, "num_hidden_layers", "PAIRING_LAYER_COUNT",
                        "layer count", "the taps were trained on another depth of model")
    out += _vocab_findings(keys, tcfg, rows)
    layers = tcfg.get("num_hidden_layers")
    if isinstance(layers, int):
        out += fmt.tap_findings(draft, layers)
    out += _verifier_findings(keys, target_view.config)
    mask_findings, token = _mask_findings(keys.mask_token_id, tcfg, target_view, vocab)
    out += mask_findings
    embedding = None
    if keys.embedding is not None:
        embed_findings, embedding = _embedding(draft_view, target_view, embed_name, progress)
        out += embed_findings
    revision, revision_source = target_revision(target_view)
    hashed = (contract.CONFIG_NAME, *TOKENIZER_FILES)
    section: PairingSection = {
        "target": target_view.location,
        "revision": revision,
        "revision_source": revision_source,
        "format": fmt.name,
        "draft": keys.to_dict(),
        "config": {"hidden_size": tcfg.get("hidden_size"), "num_hidden_layers": tcfg.get("num_hidden_layers"),
                   "vocab_size": tcfg.get("vocab_size"), "sha256": _sha256_file(target_view, contract.CONFIG_NAME)},
        "files": _file_digests(target_view, hashed),
        "embedding": embedding,
        "mask_token": token.to_dict() if token else None,
    }
    if not any(f.severity == "error" for f in out):
        same = f", embedding {embedding['verdict']})" if embedding and embedding["identical"] else ")"
        out.append(info("PAIRING_OK", target_view.location, f"pairs with this target (hidden "
                        f"{tcfg.get('hidden_size')}, {tcfg.get('num_hidden_layers')} layers, vocabulary "
                        f"{vocab}" + same))
    return out, section


def extend_report(report: Report, draft_view: CheckpointView, target: str | os.PathLike[str] | Source, *,
                  progress: Progress | None = None, endpoint: str | None = None) -> Report:
    """Add `sections["pairing"]` and the pairing findings to a verify report."""
    with about("target"):
        target_view = open_checkpoint(source_for(target, endpoint=endpoint))
    findings, section = check_pairing(draft_view, target_view, progress=progress)
    report.findings.extend(findings)
    report.sections["pairing"] = section
    return report
