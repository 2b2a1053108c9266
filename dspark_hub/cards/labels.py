"""The label under an acceptance table: which number it shows, `measured (...)` or `simulated (...)`.

`acceptance_label` derives it from an eval document (what `render` prints); `parse_label` reads it
back from a card (what `lint` checks). A sampled number's label ends with its decoding: the temperature, the
truncation, vLLM's drafting method, the samples and the 95% interval (`... , temperature 1, top-p 0.9, greedy
drafting, 2 samples x 40 prompts, AL 95% interval +-0.018`); a label without a temperature is greedy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The line that says which number an acceptance table shows: the first non-blank line after the table.
LABEL_PREFIX = "Acceptance numbers:"
LABEL_KINDS = ("measured", "simulated")
_LABEL = re.compile(r"^\*?Acceptance numbers:\s*(measured|simulated)\s*\((.*)\)\s*\*?$")
_DTYPES = ("float32", "bfloat16", "float16", "fp8", "int8", "int4")
#: A label part that is neither the engine nor the definition (stated, or written as "not stated").
_OTHER_PART = re.compile(rf"^(?:(?:k|version|dtype|prompts)\b|(?:{'|'.join(_DTYPES)})$)")
_K_PART = re.compile(r"\bk(?:=\d+| not stated)")
#: The decoding parts of a sampled label, as `decoding.EvalSampling` and `Sampling.describe` write them.
_TEMPERATURE = re.compile(r"\btemperature (\d+(?:\.\d+)?(?:e-?\d+)?)")
_TRUNCATION = re.compile(r"\b(top-p|top-k|min-p) (\d+(?:\.\d+)?(?:e-?\d+)?)")
_DRAFTING = re.compile(r"\b(greedy|probabilistic) drafting\b")


@dataclass(frozen=True)
class AcceptanceLabel:
    """Which number an acceptance table shows: `measured (vLLM x.y, k=K, dtype, prompts F)` or
    `simulated (definition, k=K, dtype, prompts F)`.

    `what` is the engine for a measurement (`vLLM 0.32.0`; a published serving number says what
    its source says) and the simulation's definition for a simulated number; `prompts` is a
    prefix of the prompts file's SHA-256. Unknown parts are written as "not stated".
    """

    kind: str                        # measured | simulated
    what: str | None = None
    version: str | None = None       # the engine's version, for a vLLM measurement
    k: int | None = None
    dtype: str | None = None
    prompts: str | None = None       # 12 hex digits of the prompts' SHA-256
    #: A sampled number's decoding (`temperature 1, top-p 0.9, greedy drafting, 2 samples x 40 prompts, AL 95%
    #: interval +-0.018`); None: greedy.
    decoding: str | None = None
    #: A table of several k (`eval --k`): the smallest and the largest, `k=1-7` (then `k` is None).
    k_range: tuple[int, int] | None = None
    #: Parts a label read from a card leaves out altogether (neither stated nor "not stated").
    missing: tuple[str, ...] = field(default=(), compare=False)

    @property
    def sampling(self) -> dict[str, Any]:
        """The decoding as data: `temperature` (0 for greedy), the truncation parts and the drafting method."""
        text = self.decoding or ""
        found = _TEMPERATURE.search(text)
        out: dict[str, Any] = {"temperature": float(found.group(1)) if found else 0.0}
        out.update({name: float(value) for name, value in _TRUNCATION.findall(text)})
        drafting = _DRAFTING.search(text)
        if drafting:
            out["drafting"] = drafting.group(1)
        return out

    @property
    def text(self) -> str:
        if self.kind == "measured":
            what = self.what or "engine not stated"
            if self.version and self.version not in what:
                what = f"{what} {self.version}"
        else:
            what = self.what or "definition not stated"
        k = f"k={self.k}" if self.k is not None else f"k={self.k_range[0]}-{self.k_range[1]}" if self.k_range \
            else "k not stated"
        parts = [what, k, self.dtype or "dtype not stated",
                 f"prompts {self.prompts}" if self.prompts else "prompts not published"]
        if self.decoding:
            parts.append(self.decoding)
        return f"{self.kind} ({', '.join(parts)})"

    @property
    def line(self) -> str:
        return f"{LABEL_PREFIX} {self.text}"


def parse_label(line: str) -> AcceptanceLabel | None:
    """An `Acceptance numbers: ...` line read back (None when the line is not one)."""
    m = _LABEL.match(line.strip())
    if not m:
        return None
    kind, inside = m.group(1), m.group(2)
    version = re.search(r"\bvLLM (\d+(?:\.\d+)+)", inside)
    k = re.search(r"\bk=(\d+)(?:-(\d+))?", inside)
    dtype = next((d for d in _DTYPES if re.search(rf"\b{d}\b", inside)), None)
    prompts = re.search(r"\bprompts ([0-9a-f]{8,64})\b", inside)
    what = _what_part(inside)
    temperature = _TEMPERATURE.search(inside)
    k_range = (int(k.group(1)), int(k.group(2))) if k and k.group(2) else None
    return AcceptanceLabel(kind=kind, what=what, version=version.group(1) if version else None,
                           k=int(k.group(1)) if k and not k_range else None, dtype=dtype,
                           prompts=prompts.group(1) if prompts else None, k_range=k_range,
                           decoding=inside[temperature.start():] if temperature else None,
                           missing=_missing_parts(kind, what, inside, has_version=version is not None))


def _what_part(inside: str) -> str | None:
    """The label's first part when it names the engine or the definition (None when it is k, dtype, ...)."""
    first = inside.split(",")[0].strip()
    return first if first and not _OTHER_PART.match(first) else None


def _missing_parts(kind: str, what: str | None, inside: str, *, has_version: bool) -> tuple[str, ...]:
    """What a label leaves out: a measurement its engine (a vLLM one also its version) and k, a
    simulation its definition; a sampled one its drafting method, samples and interval. A part written as
    "not stated" is not missing."""
    sampled = []
    if _TEMPERATURE.search(inside):
        sampled += [] if _DRAFTING.search(inside) else ["the drafting method"]
        sampled += [] if re.search(r"\bsamples\b", inside) else ["the samples"]
        sampled += [] if re.search(r"\binterval\b", inside) else ["the interval"]
    if kind == "simulated":
        return (*(() if what else ("the definition",)), *sampled)
    missing = [] if what else ["the engine"]
    if what and re.match(r"vLLM\b", what, re.IGNORECASE) and not has_version and "version not stated" not in inside:
        missing.append("the vLLM version")
    if not _K_PART.search(inside):
        missing.append("k")
    return (*missing, *sampled)


def _scopes(sources: tuple[Mapping[str, Any] | None, ...]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for source in sources:
        if isinstance(source, Mapping):
            out.append(source)
            if isinstance(source.get("harness"), Mapping):
                out.append(source["harness"])
    return out


def acceptance_label(*sources: Mapping[str, Any] | None) -> AcceptanceLabel | None:
    """The label an eval document (or a card's harness defaults) implies; earlier sources win.

    A document with `measured_by` is a measurement (`dspark-hub eval --engine vllm`, or a published
    serving number described the same way); one whose mode is `simulated` (or `teacher-forced`)
    is a simulation; anything else says neither, and gets no label.
    """
    scopes = _scopes(sources)

    def first(*names: str) -> Any:
        return next((scope[n] for scope in scopes for n in names if scope.get(n) is not None), None)

    measured = first("measured_by")
    measured = measured if isinstance(measured, Mapping) else None
    mode = str(first("mode", "measurement") or "").lower()
    if measured is not None or mode in ("measured", "served", "serving"):
        kind = "measured"
    elif mode in ("simulated", "teacher-forced") or isinstance(first("teacher_forced"), bool):
        kind = "simulated"
    else:
        return None
    measured = measured or {}
    spec = measured.get("speculative_config")
    if not isinstance(spec, Mapping):
        spec = {}
    k = first("k", "block_size", "num_speculative_tokens") or spec.get("num_speculative_tokens") or \
        measured.get("num_speculative_tokens")
    digest = measured.get("prompts_sha256") or first("prompts_fingerprint", "prompts_sha256")
    if kind == "measured":
        engine = measured.get("engine") or first("engine")
        version = measured.get("vllm_version") or measured.get("version")
        what = "vLLM" if str(engine).lower() == "vllm" else (str(engine) if engine else None)
        if what == "vLLM" and not version:
            what = "vLLM, version not stated"
    else:
        # The short name of the simulation is the label; a `definition` (the metric's whole paragraph in an
        # eval file) stands in only where nothing names the simulation.
        version, what = None, first("simulation", "simulated_by") or first("definition")
    dtype = measured.get("dtype") or first("dtype")
    return AcceptanceLabel(kind=kind, what=str(what) if what else None, version=str(version) if version else None,
                           k=int(k) if isinstance(k, int) and not isinstance(k, bool) else None,
                           dtype=str(dtype) if dtype else None,
                           prompts=str(digest)[:12] if isinstance(digest, str) and digest else None,
                           decoding=sampled_decoding(first("sampling"), first("intervals"), first("prompts")))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def sampled_decoding(sampling: Any, intervals: Any = None, prompts: Any = None) -> str | None:
    """A sampled eval's decoding as its label states it (None when greedy or not stated): temperature, truncation,
    drafting method, samples x prompts, and the AL interval's half-width."""
    if not isinstance(sampling, Mapping) or not _number(sampling.get("temperature")):
        return None
    parts = [f"temperature {sampling['temperature']:g}"]
    parts += [f"top-p {sampling['top_p']:g}"] if (_number(sampling.get("top_p")) or 1.0) < 1 else []
    parts += [f"top-k {sampling['top_k']}"] if (_number(sampling.get("top_k")) or 0) > 0 else []
    parts += [f"min-p {sampling['min_p']:g}"] if (_number(sampling.get("min_p")) or 0) > 0 else []
    parts.append(f"{sampling.get('draft_sample_method') or 'greedy'} drafting")
    if isinstance(sampling.get("samples"), int):
        parts.append(f"{sampling['samples']} samples" + (f" x {prompts} prompts" if isinstance(prompts, int) else ""))
    if isinstance(intervals, Mapping) and _number(intervals.get("half_width")) is not None:
        parts.append(f"AL 95% interval +-{intervals['half_width']:.3f}")
    else:
        parts.append("interval not stated")
    return ", ".join(parts)
