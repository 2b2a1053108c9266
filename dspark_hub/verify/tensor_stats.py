"""Streaming statistics of the tensors in a safetensors file: the scan half of `verify --deep`.

Per L2-sized slice the scan makes two integer reductions (largest positive and negative magnitude:
NaN, inf and all-zero follow from them), widens BF16 to F32 in place, and takes the sum and the sum
of squares with BLAS. Non-finite values, which the reductions reveal, take a slower path that counts
them. FP8 tensors are counted in their own encodings (`FP8`: E4M3FN has NaN and no Inf, E5M2 both,
E8M0 only NaN) and decoded through a 256-entry table. `verify.file_scan` feeds a `FileScanner` the
windows of a file in order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dspark_hub.documents import Document
from dspark_hub.format.reader import DTYPE_SIZES, SafetensorsHeader
from dspark_hub.format.tensorio import FLOAT_BITS, decode_float

#: Elements per numpy call in the stats thread: small enough that the slice and its temporaries stay in L2.
SLICE_ELEMENTS = 1 << 17


@dataclass(frozen=True)
class Fp8Encoding:
    """How one FP8 format encodes its values (each has its own NaN and Inf patterns, unlike IEEE halves).

    `magnitude`: the bits below the sign (all 8 for the unsigned E8M0); a magnitude at or above `special`
    is NaN, except `inf` (None: the format has no infinity). `values`: the 256 patterns decoded to float32.
    """

    magnitude: int
    special: int
    inf: int | None
    values: np.ndarray

    @property
    def signed(self) -> bool:
        return self.magnitude == 0x7F


def _fp8_values(exponent_bits: int, bias: int, decode_special: dict[int, float]) -> np.ndarray:
    mantissa_bits = 7 - exponent_bits
    out = np.empty(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        magnitude = b & 0x7F
        exponent, mantissa = magnitude >> mantissa_bits, magnitude & ((1 << mantissa_bits) - 1)
        if magnitude in decode_special:
            out[b] = sign * decode_special[magnitude]
        elif exponent == 0:
            out[b] = sign * mantissa / (1 << mantissa_bits) * 2.0 ** (1 - bias)
        else:
            out[b] = sign * (1 + mantissa / (1 << mantissa_bits)) * 2.0 ** (exponent - bias)
    return out


#: FP8 dtypes by their own encodings: E4M3FN (NaN S.1111.111, no Inf; max 448), E5M2 (IEEE-like: Inf
#: S.11111.00, NaN above it) and the unsigned scale format E8M0 (2^(e-127); 0xFF is NaN, no zero, no Inf).
FP8: dict[str, Fp8Encoding] = {
    "F8_E4M3": Fp8Encoding(0x7F, 0x7F, None, _fp8_values(4, 7, {0x7F: float("nan")})),
    "F8_E5M2": Fp8Encoding(0x7F, 0x7C, 0x7C, _fp8_values(
        5, 15, {0x7C: float("inf"), 0x7D: float("nan"), 0x7E: float("nan"), 0x7F: float("nan")})),
    "F8_E8M0": Fp8Encoding(0xFF, 0xFF, None, np.array(
        [2.0 ** (e - 127) for e in range(255)] + [float("nan")], dtype=np.float32)),
}
#: Row length of the matrix-vector product that sums a slice.
ROW = 512


# ---------------------------------------------------------------- per-tensor statistics

class _Scratch:
    """Reusable arrays for one stats thread (one per file scan): at most `n` elements per call."""

    def __init__(self, n: int) -> None:
        self.pairs = np.empty(n, dtype=np.uint32)    # BF16 element pairs widened to F32, odd ones then even
        self.wide = np.empty(n, dtype=np.uint32)
        self.f32 = np.empty(n, dtype=np.float32)
        self.ones = np.ones(n, dtype=np.float32)
        self.ones64 = np.ones(n, dtype=np.float64)
        self.abs = {code: np.empty(n, dtype=code) for code in ("<u2", "<u4", "<u8")}

    def floats(self, bits: np.ndarray, dtype: str) -> np.ndarray:
        """The values of `bits` as one float32 array (float64 for F64), element order not kept."""
        m = bits.size
        if dtype == "BF16" and m % 2 == 0:
            # BF16 is the high half of an F32. Read element pairs as uint32: masking keeps the odd element
            # as an F32, shifting left makes the even one; 1.5x faster than a uint16 -> uint32 cast.
            pairs, half = bits.view("<u4"), m // 2
            out = self.pairs[:m].reshape(2, half)
            np.bitwise_and(pairs, 0xFFFF_0000, out=out[0])
            np.left_shift(pairs, 16, out=out[1])
            return self.pairs[:m].view(np.float32)
        if dtype == "BF16":
            np.left_shift(bits, 16, out=self.wide[:m], dtype=np.uint32)
            return self.wide[:m].view(np.float32)
        if dtype == "F16":
            np.copyto(self.f32[:m], bits.view("<f2"), casting="unsafe")
            return self.f32[:m]
        return bits.view("<f4" if dtype == "F32" else "<f8")

    def ones_like(self, values: np.ndarray) -> np.ndarray:
        return self.ones[:values.size] if values.dtype == np.float32 else self.ones64[:values.size]


def max_magnitude(bits: np.ndarray) -> int:
    """The largest |x| bit pattern of sign-magnitude values (floats as unsigned ints), in two reductions.

    Read as signed integers, the largest non-negative value is the largest positive magnitude; read
    as unsigned, the largest value at or above the sign bit is the largest negative one. No pass
    writes a masked copy.
    """
    sign = 1 << (8 * bits.itemsize - 1)
    positive = int(bits.view(bits.dtype.str.replace("u", "i")).max())
    negative = int(bits.max())
    return max(positive if positive >= 0 else 0, negative - sign if negative >= sign else 0)


def _json_float(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass
class TensorStats(Document):
    """Streaming statistics of one tensor."""

    KEYS = ("file", "dtype", "shape", "nan", "inf", "all_zero", "mean", "std", "max_abs")

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    nan: int = 0
    inf: int = 0
    finite: int = 0
    max_bits: int = 0            # |x| bit pattern of the largest finite magnitude
    any_nonzero: bool = False    # for dtypes without float stats
    total: float = 0.0
    total_sq: float = 0.0

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_BITS or self.dtype in FP8

    @property
    def all_zero(self) -> bool:
        if self.dtype == "F8_E8M0":
            return False              # no pattern of E8M0 is zero (0x00 is 2^-127)
        if self.is_float:
            return self.nan == 0 and self.inf == 0 and self.max_bits == 0
        return not self.any_nonzero

    def mean_std(self) -> tuple[float | None, float | None]:
        """Mean and population std of the finite values (None where float32 partial sums overflowed)."""
        if not self.is_float or self.finite == 0:
            return None, None
        mean = self.total / self.finite
        var = self.total_sq / self.finite - mean * mean
        return _json_float(mean), _json_float(math.sqrt(max(0.0, var)) if math.isfinite(var) else var)

    @property
    def mean(self) -> float | None:
        """The mean of the finite values (None where float32 partial sums overflowed)."""
        return self.mean_std()[0]

    @property
    def std(self) -> float | None:
        """The population std of the finite values (None where float32 partial sums overflowed)."""
        return self.mean_std()[1]

    def max_abs(self) -> float | None:
        if not self.is_float or self.finite == 0:
            return None
        if self.dtype in FP8:
            return float(FP8[self.dtype].values[self.max_bits])
        bits_dtype = FLOAT_BITS[self.dtype][0]
        return float(decode_float(np.array([self.max_bits], dtype=bits_dtype).tobytes(), self.dtype)[0])


class _Accumulator:
    """Feeds one tensor's bytes (arbitrary split points) into its `TensorStats`."""

    def __init__(self, stats: TensorStats, scratch: _Scratch) -> None:
        self.stats = stats
        self.scratch = scratch
        self.itemsize = DTYPE_SIZES[stats.dtype]
        self.carry = b""

    def feed(self, data: memoryview) -> None:
        if self.carry:
            need = self.itemsize - len(self.carry)
            head, data = bytes(self.carry) + bytes(data[:need]), data[need:]
            if len(head) < self.itemsize:
                self.carry = head
                return
            self.carry = b""
            self._feed_aligned(memoryview(head))
        whole = len(data) - len(data) % self.itemsize
        if whole < len(data):
            self.carry = bytes(data[whole:])
        if whole:
            self._feed_aligned(data[:whole])

    def _feed_aligned(self, data: memoryview) -> None:
        s = self.stats
        if not s.is_float:
            s.any_nonzero = s.any_nonzero or bool(np.frombuffer(data, dtype=np.uint8).any())
            return
        if s.dtype in FP8:
            self._feed_fp8(np.frombuffer(data, dtype=np.uint8), FP8[s.dtype])
            return
        code, _, inf_bits = FLOAT_BITS[s.dtype]
        bits = np.frombuffer(data, dtype=code)
        for i in range(0, bits.size, SLICE_ELEMENTS):   # every pass over a slice reads it from L2
            piece = bits[i:i + SLICE_ELEMENTS]
            top = max_magnitude(piece)
            if top >= inf_bits:   # rare: count the non-finite values, keep the finite ones
                self._non_finite_slice(piece)
                continue
            s.max_bits = max(s.max_bits, top)
            s.finite += piece.size
            if top:               # a slice of zeros adds nothing
                self._add(self.scratch.floats(piece, s.dtype))

    def _feed_fp8(self, bits: np.ndarray, encoding: Fp8Encoding) -> None:
        """FP8 slices: two reductions find the largest magnitude (as for the wider floats); a slice holding a
        special pattern counts NaN and Inf in the format's own encoding; values come from its 256-entry table."""
        s, values = self.stats, self.scratch.f32
        for i in range(0, bits.size, SLICE_ELEMENTS):
            piece = bits[i:i + SLICE_ELEMENTS]
            top = max_magnitude(piece) if encoding.signed else int(piece.max())
            if top >= encoding.special:
                magnitude = piece & encoding.magnitude if encoding.signed else piece
                inf = int(np.count_nonzero(magnitude == encoding.inf)) if encoding.inf is not None else 0
                special = magnitude >= encoding.special
                s.inf += inf
                s.nan += int(np.count_nonzero(special)) - inf
                piece = piece[~special]
                if not piece.size:
                    continue
                top = int((piece & encoding.magnitude).max())
            s.max_bits = max(s.max_bits, top)
            s.finite += piece.size
            if top or not encoding.signed:      # every E8M0 pattern is a non-zero value
                np.take(encoding.values, piece, out=values[:piece.size])
                self._add(values[:piece.size])

    def _add(self, values: np.ndarray) -> None:
        # BLAS is several times faster than ufunc reductions here. The sum is a matrix-vector product
        # with a short vector of ones, so it reads the values alone (a dot with ones reads twice the bytes).
        rows = values.size // ROW
        ones = self.scratch.ones_like(values)
        total = float((values[:rows * ROW].reshape(rows, ROW) @ ones[:ROW]).sum()) if rows else 0.0
        self.stats.total += total + float(np.dot(values[rows * ROW:], ones[:values.size - rows * ROW]))
        self.stats.total_sq += float(np.dot(values, values))

    def _non_finite_slice(self, bits: np.ndarray) -> None:
        s, scratch = self.stats, self.scratch
        code, mask, inf_bits = FLOAT_BITS[s.dtype]
        magnitude = np.bitwise_and(bits, mask, out=scratch.abs[code][:bits.size])
        s.nan += int(np.count_nonzero(magnitude > inf_bits))
        s.inf += int(np.count_nonzero(magnitude == inf_bits))
        finite = magnitude < inf_bits
        if not finite.any():
            return
        kept = bits[finite]
        s.max_bits = max(s.max_bits, int(magnitude[finite].max()))
        s.finite += kept.size
        self._add(scratch.floats(kept, s.dtype))


class FileScanner:
    """Routes sequential file chunks to the accumulators of the tensors they overlap."""

    def __init__(self, header: SafetensorsHeader, file: str) -> None:
        scratch = _Scratch(SLICE_ELEMENTS)
        self.spans: list[tuple[int, int, _Accumulator]] = []
        self.stats: list[TensorStats] = []
        for name, info in header.tensors.items():   # data order
            stats = TensorStats(name=name, file=file, dtype=info.dtype, shape=info.shape)
            start, end = header.absolute_range(name)
            self.spans.append((start, end, _Accumulator(stats, scratch)))
            self.stats.append(stats)
        self.next = 0

    def feed(self, offset: int, data: memoryview) -> None:
        with np.errstate(over="ignore", invalid="ignore"):   # overflowing sums are reported as null
            self._feed(offset, data)

    def _feed(self, offset: int, data: memoryview) -> None:
        end = offset + len(data)
        while self.next < len(self.spans):
            start, stop, acc = self.spans[self.next]
            if start >= end:
                return
            lo, hi = max(start, offset), min(stop, end)
            if hi > lo:
                acc.feed(data[lo - offset:hi - offset])
            if stop > end:
                return
            self.next += 1
