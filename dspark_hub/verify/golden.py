"""Golden vectors: a small fixture of inputs and the reference forward's outputs, bound to one draft.

`write_golden(ckpt, out)` runs the reference forward (`dspark_hub.modeling`, float32) on seeded
inputs and writes them with the expected outputs to one safetensors file; `check_golden(ckpt,
golden)` recomputes and compares within the tolerances stored in the file. A runtime or
converter author reproduces the same numbers with their kernels to prove the draft loads and
runs as trained.

Cases (``short``, ``long``): each has ``B`` requests of ``C`` context rows and one block of ``K``
slots. ``short`` puts the context at positions ``0..C-1``; ``long`` starts it at
``2 * original_max_position_embeddings`` so the YaRN-interpolated band of the rotary and the
mscale of the softmax both matter.

Tensors (``{case}.`` prefix):

- inputs: ``context_states`` ``[B, C, T*Ht]`` float32 (seeded normal), ``position_ids``
  ``[B, C+K]`` int64 (context then block rows), ``anchor_ids`` ``[B]``, ``drafted_tokens``
  ``[B, K]`` (seeded ids, the teacher-forced Markov predecessors are ``[anchor, d_0..d_{K-2}]``);
- expected: ``last_hidden_state`` ``[B, K, D]`` (after ``final_norm``) for the block
  ``[anchor, mask, ...]``; ``markov_bias`` ``[B, K]`` the bias of slot k's predecessor at
  ``drafted_tokens[k]``; ``confidence`` ``[B, K]`` ``sigmoid(proj([z_k ; w1[prev_k]]))`` with the
  same predecessors (absent without a confidence head); ``greedy_tokens`` ``[B, K]`` and
  ``greedy_logits`` ``[B, K]`` (the Markov-corrected logit of each greedy draft) with the
  ``lm_head`` below.

``lm_head``: a weight passed in (its SHA-256 is recorded and `check` needs the same file), or a
documented stand-in: ``torch.randn(draft_vocab_size, hidden_size, generator=torch.Generator().
manual_seed(seed)) * hidden_size ** -0.5`` in float32, regenerated from the recorded seed.

Metadata (``__metadata__``, strings): ``schema`` ``dspark-hub/golden-fixture/1``, ``config`` (the draft's
config.json, JSON), ``config_sha256``, ``weights_sha256`` (JSON: file -> SHA-256), ``lm_head``
(JSON), ``tolerances`` (JSON: tensor -> {"atol", "rtol"}; int tensors are compared exactly),
``block_size``, ``seed``, ``cases`` (JSON), ``dtype`` ``float32``, ``torch``, ``dspark_hub``.

Tolerances: the defaults (atol 1e-5, rtol 1e-4 on float outputs) are for a float32 recompute of
the reference; a bf16 serving kernel needs looser ones (`check_golden(..., atol=, rtol=)`,
``--atol/--rtol``), while greedy tokens are always compared exactly.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from dspark_hub import __version__, schemas
from dspark_hub._text import plural
from dspark_hub.documents import Document
from dspark_hub.errors import (
    CheckpointNotFoundError,
    ContractError,
    UsageError,
)
from dspark_hub.format import contract
from dspark_hub.format.digests import sha256_file
from dspark_hub.format.jsonio import load_json_object
from dspark_hub.format.reader import read_header
from dspark_hub.format.tensorio import iter_range, weight_files
from dspark_hub.format.writer import atomic_path, check_writable, refuse_own_inputs
from dspark_hub.verify.checks import verify
from dspark_hub.verify.golden_fixture import FLOAT_OUTPUTS, MAX_BLOCK_SIZE, load_checked, read_fixture

if TYPE_CHECKING:
    import torch

    from dspark_hub.modeling import K3DSparkModel

#: `__metadata__["schema"]` of a fixture.
SCHEMA = schemas.GOLDEN_FIXTURE
DEFAULT_SEED = 0
BATCH = 2
CONTEXT_ROWS = 6
DEFAULT_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}
INT_OUTPUTS = ("greedy_tokens",)
INPUTS = ("context_states", "position_ids", "anchor_ids", "drafted_tokens")
LM_HEAD_NAME = "lm_head.weight"
#: lm_head dtypes a fixture takes (safetensors name -> torch name).
_HEAD_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
#: Config keys the lm_head's shape comes from: a fixture written for other values is not recomputed.
_HEAD_KEYS = ("hidden_size", "draft_vocab_size")


class Comparison(TypedDict):
    """One compared tensor of a `GoldenCheck` (`--json` lists them): exact (`mismatches`), within tolerance
    (`atol`, `rtol`), or not comparable (`detail`)."""

    tensor: str
    ok: bool
    max_abs: float | None
    detail: NotRequired[str]
    mismatches: NotRequired[int]
    atol: NotRequired[float]
    rtol: NotRequired[float]


class LmHeadFile(TypedDict):
    """The fixture was computed with this lm_head file (`check` needs the same bytes)."""

    kind: Literal["file"]
    sha256: str
    shape: list[int]


class LmHeadStandin(TypedDict):
    """The fixture was computed with the documented seeded stand-in (`standin_lm_head`)."""

    kind: Literal["seeded-standin"]
    seed: int
    std: str
    dtype: str
    shape: list[int]
    recipe: str


LmHead = LmHeadFile | LmHeadStandin


@dataclass(frozen=True)
class GoldenWrite(Document):
    """What `write_golden` wrote: the fixture `path` of the checkpoint `input`."""

    SCHEMA = schemas.command("golden-write")

    path: Path
    input: Path
    cases: dict[str, int]             # case name -> first context position
    tensors: list[str]
    lm_head: LmHead
    bytes: int


@dataclass
class GoldenCheck(Document):
    """The outcome of `check_golden` of the checkpoint `input` against `fixture`: every comparison, what differs."""

    SCHEMA = schemas.command("golden-check")
    KEYS = ("ok", "input", "fixture", "problems", "comparisons")

    fixture: str
    input: str
    comparisons: list[Comparison] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(c["ok"] for c in self.comparisons)


def _weight_digests(folder: Path) -> dict[str, str]:
    files = weight_files(folder)
    if not files:
        raise CheckpointNotFoundError(f"{folder}: no *.safetensors", hint="pass a k3_dspark checkpoint folder")
    return {p.name: sha256_file(p) for p in files}


def _cases(config: Mapping[str, Any], block_size: int) -> dict[str, int]:
    """Case name -> first context position. `long` sits beyond the YaRN original window."""
    original = (config.get("rope_parameters") or {}).get("original_max_position_embeddings")
    long_start = 2 * int(original) if original else 4 * CONTEXT_ROWS
    limit = int(config.get("max_position_embeddings") or long_start + CONTEXT_ROWS + block_size)
    if long_start + CONTEXT_ROWS + block_size > limit:
        long_start = max(0, limit - CONTEXT_ROWS - block_size)
    return {"short": 0, "long": long_start}


def _inputs(config: Mapping[str, Any], start: int, block_size: int,
            generator: torch.Generator) -> dict[str, torch.Tensor]:
    import torch

    width = int(config["num_target_layers"]) * int(config["target_hidden_size"])
    vocab, mask = int(config["vocab_size"]), int(config["mask_token_id"])
    positions = torch.arange(start, start + CONTEXT_ROWS + block_size, dtype=torch.long).expand(BATCH, -1)

    def ids(*shape: int) -> torch.Tensor:
        out = torch.randint(0, vocab - 1, shape, generator=generator)
        return torch.where(out >= mask, out + 1, out)        # never the mask id itself

    return {"context_states": torch.randn(BATCH, CONTEXT_ROWS, width, generator=generator),
            "position_ids": positions.contiguous(), "anchor_ids": ids(BATCH), "drafted_tokens": ids(BATCH, block_size)}


def standin_lm_head(config: Mapping[str, Any], seed: int) -> torch.Tensor:
    """The documented stand-in lm_head: seeded normal, scaled by hidden_size ** -0.5, float32."""
    import torch

    hidden, vocab = int(config["hidden_size"]), int(config["draft_vocab_size"])
    scale: float = hidden ** -0.5
    return torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed)) * scale


def _load_lm_head(path: str | os.PathLike[str], config: Mapping[str, Any]) -> torch.Tensor:
    """The lm_head weight in `path`, which must be [draft_vocab_size, hidden_size] of `config`; its shape is
    checked in the header before its bytes are read (through `open_regular`: a FIFO is refused unopened)."""
    import torch

    header = read_header(path)
    if len(header.tensors) != 1 and LM_HEAD_NAME not in header.tensors:
        raise UsageError(f"{path}: holds {plural(len(header.tensors), 'tensor')} and no {LM_HEAD_NAME}; pass a file "
                         "with the target's lm_head weight")
    name = LM_HEAD_NAME if LM_HEAD_NAME in header.tensors else next(iter(header.tensors))
    info = header.tensors[name]
    want = [int(config["draft_vocab_size"]), int(config["hidden_size"])]
    if list(info.shape) != want or info.dtype not in _HEAD_DTYPES:
        raise UsageError(f"{path}: {name} is {list(info.shape)} {info.dtype}; this draft scores with a {want} "
                         "float lm_head (draft_vocab_size, hidden_size)", hint="pass the lm_head of the target it "
                         "was trained on")
    data = bytearray()
    for piece in iter_range(path, *header.absolute_range(name)):
        data += piece
    return torch.frombuffer(data, dtype=getattr(torch, _HEAD_DTYPES[info.dtype])).reshape(want).float()


def _outputs(model: K3DSparkModel, inputs: Mapping[str, torch.Tensor], lm_head: torch.Tensor,
             block_size: int) -> dict[str, torch.Tensor]:
    import torch

    anchors, drafted = inputs["anchor_ids"], inputs["drafted_tokens"]
    with torch.no_grad():
        proposal = model.propose_block(inputs["context_states"], anchors, lm_head, block_size=block_size,
                                       position_ids=inputs["position_ids"])
        tokens, logits, last = proposal.tokens, proposal.logits, proposal.last_hidden_state
        assert tokens is not None and logits is not None and last is not None   # propose_block sets all three
        hidden = last.float()
        prev = torch.cat((anchors[:, None], drafted[:, :-1]), dim=1)
        bias = model.markov_bias(prev).float().gather(-1, drafted[..., None]).squeeze(-1)
        out = {"last_hidden_state": hidden, "markov_bias": bias,
               "greedy_tokens": tokens.long(),
               "greedy_logits": logits.gather(-1, tokens[..., None]).squeeze(-1).float()}
        if model.confidence_head is not None:
            out["confidence"] = model.confidence(hidden, prev).float()
    return out


def _verified_config(folder: Path) -> dict[str, Any]:
    """The checkpoint's config, once `checks.verify` finds no error (the forward needs a sound checkpoint).

    Raises:
        UsageError: verify reports an error; the message is its first one.
    """

    report = verify(folder)
    if not report.ok:
        first = report.errors[0]
        raise UsageError(f"{folder / first.where}: {first.message}; fix it first ('dspark-hub verify {folder}' "
                         "lists every problem)")
    return load_json_object(folder / contract.CONFIG_NAME)    # verify read it strictly: no error left here


def _differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    missing = object()
    return sorted(k for k in a.keys() | b.keys() if a.get(k, missing) != b.get(k, missing))


def _same_roster(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    try:
        return contract.roster(a) == contract.roster(b)
    except ContractError:
        return False


def _load_model(folder: Path) -> K3DSparkModel:
    import torch

    from dspark_hub.modeling import load_checkpoint  # torch and transformers

    model = load_checkpoint(folder, dtype=torch.float32).model
    model.train(False)   # eval mode (transformers' own eval() is unannotated)
    return model


def write_golden(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *,
                 lm_head: str | os.PathLike[str] | None = None, seed: int = DEFAULT_SEED, block_size: int = 7,
                 force: bool = False) -> GoldenWrite:
    """Write the golden fixture of a checkpoint.

    Args:
        checkpoint: a k3_dspark checkpoint folder.
        out: the golden `.safetensors` file to write (temp file + rename).
        lm_head: a safetensors file with the target's lm_head weight; None: the seeded stand-in.
        seed: seeds the inputs (and the stand-in lm_head).
        block_size: slots per block (the reference serves 7).
        force: replace an existing `out`.

    Returns:
        A `GoldenWrite` (path, cases, tensors, lm_head, bytes).

    Raises:
        RefusedOverwriteError: `out` exists and `force` is False.
        UsageError: `checks.verify` finds an error in the checkpoint (the first one is named).
        CheckpointNotFoundError / CheckpointFormatError: the checkpoint cannot be loaded strictly.
    """
    import torch
    from safetensors.torch import save_file

    folder, target = Path(checkpoint), Path(out)
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise UsageError(f"{block_size}: a fixture holds one block of 1..{MAX_BLOCK_SIZE} slots (the reference serves "
                         "7)", param="block_size")
    if target.suffix == ".safetensors" and target.resolve().parent == folder.resolve():
        raise UsageError(f"{target}: a golden fixture beside the weights would be loaded as weights by runtimes "
                         f"that read every top-level *.safetensors; write it to "
                         f"{folder / contract.GOLDEN_DIR / target.name}")
    refuse_own_inputs(target, [("checkpoint", folder), ("lm_head", lm_head)], param="out", folder=False)
    checked = check_writable(target, force=force)
    config = _verified_config(folder)
    model = _load_model(folder)
    head = _load_lm_head(lm_head, config) if lm_head is not None else standin_lm_head(config, seed)
    head_info: LmHead = (
        {"kind": "file", "sha256": sha256_file(Path(lm_head)), "shape": list(head.shape)} if lm_head else
        {"kind": "seeded-standin", "seed": seed, "std": "hidden_size ** -0.5", "dtype": "float32",
         "shape": list(head.shape), "recipe": "torch.randn(V, D, generator=torch.Generator()."
                                              "manual_seed(seed)) * D ** -0.5"})
    generator = torch.Generator().manual_seed(seed)
    cases = _cases(config, block_size)
    tensors: dict[str, torch.Tensor] = {}
    for case, start in cases.items():
        inputs = _inputs(config, start, block_size, generator)
        for name, value in {**inputs, **_outputs(model, inputs, head, block_size)}.items():
            tensors[f"{case}.{name}"] = value.contiguous()
    metadata = {
        "schema": SCHEMA, "config": json.dumps(config), "config_sha256": sha256_file(folder / contract.CONFIG_NAME),
        "weights_sha256": json.dumps(_weight_digests(folder)), "lm_head": json.dumps(head_info),
        "tolerances": json.dumps({name: DEFAULT_TOLERANCE for name in FLOAT_OUTPUTS}),
        "block_size": str(block_size), "seed": str(seed),
        "cases": json.dumps({c: {"context_start": s, "batch": BATCH, "context_rows": CONTEXT_ROWS}
                             for c, s in cases.items()}),
        "dtype": "float32", "torch": torch.__version__, "dspark_hub": __version__,
    }
    with atomic_path(target, force=force, checked=checked) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return GoldenWrite(path=target, input=folder, cases=cases, tensors=sorted(tensors), lm_head=head_info,
                       bytes=target.stat().st_size)


def _compare(name: str, got: torch.Tensor, want: torch.Tensor, tol: Mapping[str, float] | None) -> Comparison:
    import torch

    if got.shape != want.shape:
        return {"tensor": name, "ok": False, "max_abs": None, "detail": f"shape {list(got.shape)} vs "
                f"{list(want.shape)}"}
    if tol is None:
        mismatches = int((got != want).sum())
        return {"tensor": name, "ok": mismatches == 0, "max_abs": None, "mismatches": mismatches}
    diff = (got.double() - want.double()).abs()
    ok = bool(torch.all(diff <= tol["atol"] + tol["rtol"] * want.double().abs()))
    return {"tensor": name, "ok": ok, "max_abs": float(diff.max()) if diff.numel() else 0.0, "atol": tol["atol"],
            "rtol": tol["rtol"]}


def check_golden(checkpoint: str | os.PathLike[str], golden: str | os.PathLike[str], *,
                 lm_head: str | os.PathLike[str] | None = None, atol: float | None = None,
                 rtol: float | None = None) -> GoldenCheck:
    """Recompute a golden fixture on `checkpoint` and compare.

    Args:
        checkpoint: the checkpoint folder the fixture claims to describe.
        golden: the fixture written by `write_golden`.
        lm_head: the lm_head file, when the fixture was written with one.
        atol, rtol: override the stored tolerances for every float output.

    Raises:
        UsageError: the file is not a golden fixture, or needs an lm_head file that was not given, or
            `checks.verify` finds an error in the checkpoint.
    """
    folder, path = Path(checkpoint), Path(golden)
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{value}: a tolerance is a finite number >= 0", param=name)
    meta, header = read_fixture(path)
    config = _verified_config(folder)
    result = GoldenCheck(fixture=str(path), input=str(folder))
    written_for = meta["config"]
    differing = _differing_keys(written_for, config)
    if sha256_file(folder / contract.CONFIG_NAME) != meta["config_sha256"]:
        keys = f"; keys that differ: {', '.join(differing)}" if differing else ""
        result.problems.append(f"config.json differs from the one the fixture was written for (config_sha256{keys})")
    if not _same_roster(written_for, config) or any(written_for.get(k) != config.get(k) for k in _HEAD_KEYS):
        result.problems.append("the checkpoint's tensor shapes differ from the fixture's, so nothing was "
                               "recomputed; check the fixture against the checkpoint it was written for")
        return result
    confidence = any(name.startswith("confidence_head.") for name in contract.roster(config))
    stored = load_checked(path, header, meta, config, confidence)
    digests = _weight_digests(folder)
    if digests != meta["weights_sha256"]:
        result.problems.append("weight files differ from the ones the fixture was written for (weights_sha256)")
    head_info = meta["lm_head"]
    if head_info["kind"] == "file":
        if lm_head is None:
            raise UsageError(f"{path}: was written with an lm_head file (sha256 {head_info['sha256'][:16]}); pass "
                             "it as `lm_head`")
        if sha256_file(Path(lm_head)) != head_info["sha256"]:
            result.problems.append("the lm_head file differs from the one the fixture was written with")
        head = _load_lm_head(lm_head, config)
    else:
        head = standin_lm_head(config, int(head_info["seed"]))
    tolerances = meta["tolerances"]
    model = _load_model(folder)
    block_size = meta["block_size"]
    for case in meta["cases"]:
        inputs = {name: stored[f"{case}.{name}"] for name in INPUTS}
        for name, got in _outputs(model, inputs, head, block_size).items():
            key = f"{case}.{name}"
            if key not in stored:
                result.problems.append(f"{key}: recomputed but absent from the fixture")
                continue
            tol = None if name in INT_OUTPUTS else {
                "atol": atol if atol is not None else tolerances[name]["atol"],
                "rtol": rtol if rtol is not None else tolerances[name]["rtol"]}
            result.comparisons.append(_compare(key, got, stored[key], tol))
    return result
