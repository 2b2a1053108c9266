"""Is the draft's frozen `embed_tokens.weight` the target's embedding? One rule for `--target` and `--frozen-embed`.

The comparison is made in the draft's dtype. When the target stores the same dtype, the verdict
is raw byte identity. When it stores F32 or F16 (every transformers `save_pretrained` of a small
model is F32) and the draft BF16, the target's values are cast exactly (round to nearest even,
as a runtime does when it loads the target in BF16) and the draft must equal that, byte for byte:
"identical after BF16 rounding (nearest even) of the F32 target". Any other pair of dtypes has no
exact cast and is never identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dspark_hub.format.tensorio import CastDigest, TensorDigest, cast_text
from dspark_hub.report import EmbeddingVerdict


@dataclass(frozen=True)
class EmbeddingComparison:
    """The verdict on a draft embedding against a target (or target) embedding."""

    draft: TensorDigest | None
    target: CastDigest | None
    who: str = "target"

    @property
    def compared_as(self) -> Literal["bytes", "cast"] | None:
        """`bytes` when both are stored in one dtype; `cast` when the target was cast to the draft's dtype."""
        if self.draft is None or self.target is None:
            return None
        return "bytes" if self.draft.dtype == self.target.stored.dtype or self.target.cast is None else "cast"

    @property
    def compared_with(self) -> TensorDigest | None:
        """The target digest the draft is held against: as stored, or cast to the draft's dtype."""
        if self.target is None:
            return None
        return self.target.cast if self.compared_as == "cast" else self.target.stored

    @property
    def identical(self) -> bool | None:
        if self.draft is None or self.target is None:
            return None
        theirs = self.compared_with
        assert theirs is not None
        return (self.draft.dtype, self.draft.shape, self.draft.sha256) == (theirs.dtype, theirs.shape, theirs.sha256)

    @property
    def sameness(self) -> str:
        """What identity means here: `bit-identical to` / `identical to the BF16 rounding (nearest even) of`."""
        if self.compared_as == "cast":
            assert self.draft is not None
            return f"identical to the {self.draft.dtype} rounding (nearest even) of"
        return "bit-identical to"

    @property
    def verdict(self) -> str | None:
        """`bit-identical`, `identical after BF16 rounding (nearest even) of the F32 target`, or `different`."""
        if self.identical is None:
            return None
        if not self.identical:
            return "different"
        if self.compared_as == "cast":
            assert self.target is not None and self.draft is not None
            return f"identical after {cast_text(self.target.stored.dtype, self.draft.dtype)} {self.who}"
        return "bit-identical"

    @property
    def evidence(self) -> str:
        """Both sides in a message: dtype, shape and the first 16 hex digits of each digest."""
        d, t = self.draft, self.compared_with
        if d is None or t is None:
            return "not compared"
        theirs = "of the rounded values " if self.compared_as == "cast" else ""
        stored = self.target.stored.dtype if self.target is not None else t.dtype
        note = (f"; the {self.who} stores {stored}" if self.compared_as == "cast"
                else "" if d.dtype == t.dtype else f"; no exact cast from {t.dtype} to {d.dtype}")
        return (f"{d.dtype} {list(d.shape)} sha256 {d.sha256[:16]} vs {t.dtype} {list(t.shape)} sha256 "
                f"{theirs}{t.sha256[:16]}{note}")

    def to_dict(self) -> EmbeddingVerdict:
        """The comparison keys of a JSON section: `target_cast`, `compared_as`, `identical`, `verdict`."""
        cast = self.target.cast if self.target is not None else None
        return {"target_cast": cast.to_dict() if cast is not None else None, "compared_as": self.compared_as,
                "identical": self.identical, "verdict": self.verdict}


def compare_embeddings(draft: TensorDigest | None, target: CastDigest | None, *,
                       who: str = "target") -> EmbeddingComparison:
    """Compare a draft embedding with a target's (`who` names the other side in the verdict)."""
    return EmbeddingComparison(draft=draft, target=target, who=who)
