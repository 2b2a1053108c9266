"""The strict header reader: one failing fixture per rule, a passing twin, and properties."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import save, save_file

from dspark_hub.errors import CheckpointFormatError
from dspark_hub.format import contract
from dspark_hub.format.reader import FORMAT_CODES, parse_index, read_header

from .factories import raw_safetensors

GOOD = {
    "__metadata__": {"torchspec_version": "0.1.0"},
    "a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
    "b.bias": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]},
}
GOOD_DATA = bytes(16)


def entry(**changes):
    doc = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        doc[key] = value
    return doc


def expect(tmp_path, code, header, data=GOOD_DATA, **kw):
    path = raw_safetensors(tmp_path / "model.safetensors", header, data, **kw)
    with pytest.raises(CheckpointFormatError) as info:
        read_header(path)
    assert info.value.code == code, str(info.value)
    assert code in FORMAT_CODES
    assert "model.safetensors" in str(info.value)
    return info.value


def test_passing_twin_reads_back_what_safetensors_wrote(tmp_path):
    tensors = {"b.bias": torch.zeros(1), "a.weight": torch.ones(2, 3, dtype=torch.bfloat16)}
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"k": "v"})
    header = read_header(tmp_path / "model.safetensors")
    assert header.metadata == {"k": "v"}
    assert {n: (t.dtype, t.shape) for n, t in header.tensors.items()} == {
        "a.weight": ("BF16", (2, 3)), "b.bias": ("F32", (1,))}
    assert header.data_start + sum(t.nbytes for t in header.tensors.values()) == header.file_size


def test_our_raw_good_fixture_passes(tmp_path):
    header = read_header(raw_safetensors(tmp_path / "m.safetensors", GOOD, GOOD_DATA))
    assert list(header.tensors) == ["a.weight", "b.bias"]
    assert header.absolute_range("b.bias") == (header.data_start + 12, header.data_start + 16)


def test_file_too_small(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointFormatError) as info:
        read_header(p)
    assert info.value.code == "FILE_TOO_SMALL"


def test_lfs_pointer_is_named(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 7124633450\n")
    with pytest.raises(CheckpointFormatError) as info:
        read_header(p)
    assert info.value.code == "LFS_POINTER"
    assert "git lfs pull" in str(info.value)


def test_header_too_large(tmp_path):
    expect(tmp_path, "HEADER_TOO_LARGE", b"{}", length=100_000_001)


def test_header_exactly_at_limit_is_not_too_large(tmp_path):
    err = expect(tmp_path, "HEADER_OUT_OF_BOUNDS", b"{}", length=100_000_000)
    assert "runs past" in str(err)


def test_header_out_of_bounds(tmp_path):
    expect(tmp_path, "HEADER_OUT_OF_BOUNDS", b"{}", b"", length=50)


def test_not_utf8(tmp_path):
    expect(tmp_path, "HEADER_NOT_UTF8", b'{"\xff": 1}', b"")


def test_not_json(tmp_path):
    expect(tmp_path, "HEADER_NOT_JSON", b'{"a": ', b"")


def test_nan_literal_rejected(tmp_path):
    expect(tmp_path, "HEADER_NOT_JSON", b'{"__metadata__": {"x": NaN}}', b"")


@pytest.mark.parametrize("raw", [
    b'{"a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},'
    b' "a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}',
    b'{"__metadata__": {"k": "1", "k": "2"}, "a": {"dtype": "U8", "shape": [12], "data_offsets": [0, 12]}}',
    b'{"a": {"dtype": "U8", "dtype": "U8", "shape": [12], "data_offsets": [0, 12]}}',
], ids=["top-level", "in-metadata", "in-tensor-entry"])
def test_duplicate_keys_rejected_at_any_depth(tmp_path, raw):
    err = expect(tmp_path, "DUPLICATE_KEY", raw, bytes(12))
    assert "appears twice" in str(err)


def test_safetensors_library_itself_accepts_the_duplicate(tmp_path):
    # Why the strict reader exists: the reference library silently takes one of the two.
    from safetensors import safe_open
    raw = (b'{"a": {"dtype": "U8", "shape": [12], "data_offsets": [0, 12]},'
           b' "a": {"dtype": "U8", "shape": [12], "data_offsets": [0, 12]}}')
    path = raw_safetensors(tmp_path / "model.safetensors", raw + b" " * (-len(raw) % 8), bytes(12))
    with safe_open(str(path), "pt") as f:
        assert list(f.keys()) == ["a"]


def test_header_not_object(tmp_path):
    expect(tmp_path, "HEADER_NOT_OBJECT", b"[1, 2]", b"")


@pytest.mark.parametrize("meta", [{"k": 1}, ["a"], "s", {"k": None}])
def test_invalid_metadata(tmp_path, meta):
    expect(tmp_path, "INVALID_METADATA", entry(__metadata__=meta))


@pytest.mark.parametrize("value", [
    "x", {"dtype": "BF16", "shape": [2, 3]},
    {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12], "extra": 1}])
def test_invalid_tensor_entry(tmp_path, value):
    expect(tmp_path, "INVALID_TENSOR_ENTRY", entry(**{"a.weight": value}))


@pytest.mark.parametrize("dtype", ["BF17", "bf16", 3])
def test_unknown_dtype(tmp_path, dtype):
    expect(tmp_path, "UNKNOWN_DTYPE", entry(**{"a.weight": {"dtype": dtype, "shape": [2, 3],
                                                             "data_offsets": [0, 12]}}))


@pytest.mark.parametrize("shape", [[2, -3], [2.0, 3], [True, 6], "6", None])
def test_invalid_shape(tmp_path, shape):
    expect(tmp_path, "INVALID_SHAPE", entry(**{"a.weight": {"dtype": "BF16", "shape": shape,
                                                             "data_offsets": [0, 12]}}))


@pytest.mark.parametrize("offsets", [[12, 0], [0], [-1, 11], [0.0, 12], "0-12"])
def test_invalid_offsets(tmp_path, offsets):
    expect(tmp_path, "INVALID_OFFSETS", entry(**{"a.weight": {"dtype": "BF16", "shape": [2, 3],
                                                               "data_offsets": offsets}}))


def test_size_mismatch(tmp_path):
    expect(tmp_path, "SIZE_MISMATCH", entry(**{"a.weight": {"dtype": "BF16", "shape": [2, 3],
                                                             "data_offsets": [0, 10]}}), bytes(14))


def test_offset_out_of_bounds(tmp_path):
    expect(tmp_path, "OFFSET_OUT_OF_BOUNDS", GOOD, bytes(15))


def test_overlap(tmp_path):
    doc = entry(**{"b.bias": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})
    expect(tmp_path, "TENSOR_OVERLAP", doc, bytes(12))


def test_gap(tmp_path):
    doc = entry(**{"b.bias": {"dtype": "F32", "shape": [1], "data_offsets": [14, 18]}})
    expect(tmp_path, "TENSOR_GAP", doc, bytes(18))


def test_trailing_bytes(tmp_path):
    expect(tmp_path, "TRAILING_BYTES", GOOD, bytes(20))


def test_header_never_reads_tensor_data(tmp_path, monkeypatch):
    path = raw_safetensors(tmp_path / "model.safetensors", GOOD, GOOD_DATA)
    reads = []
    import builtins
    real_open = builtins.open

    class Spy:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            reads.append(n)
            return self.f.read(n)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    from dspark_hub.format import reader
    monkeypatch.setattr(reader, "open_regular", lambda path, display=None: Spy(real_open(path, "rb")))
    header = read_header(path)
    assert sum(reads) == 8 + header.header_length


def test_reference_header_length_and_size():
    header = contract.expected_header(contract.REFERENCE_CONFIG)
    assert len(header) == contract.REFERENCE_ARTIFACT.header_length
    assert contract.expected_file_size(contract.REFERENCE_CONFIG) == contract.REFERENCE_ARTIFACT.file_size


# ----------------------------------------------------------------- shard index

def test_index_passing_twin():
    index = parse_index(json.dumps({"metadata": {"total_size": 4}, "weight_map": {"a": "x.safetensors"}}).encode(),
                        path="i.json")
    assert index.files == ["x.safetensors"] and index.total_size == 4


@pytest.mark.parametrize("target", ["/etc/passwd", "../model.safetensors", "a/../../b", "C:\\x", "", "./a"])
def test_index_unsafe_paths(target):
    with pytest.raises(CheckpointFormatError) as info:
        parse_index(json.dumps({"weight_map": {"a": target}}).encode(), path="i.json")
    assert info.value.code == "INDEX_UNSAFE_PATH"


@pytest.mark.parametrize("doc", [{}, {"weight_map": []}, {"weight_map": {"a": 3}},
                                 {"weight_map": {}, "metadata": {"total_size": "9"}}])
def test_index_invalid(doc):
    with pytest.raises(CheckpointFormatError) as info:
        parse_index(json.dumps(doc).encode(), path="i.json")
    assert info.value.code == "INDEX_INVALID"


# ----------------------------------------------------------------- properties

VALID = save({"x.weight": torch.ones(3, 4, dtype=torch.bfloat16), "y": torch.zeros(2)},
             metadata={"torchspec_version": "0.1.0"})


def _read_bytes(tmp_path_factory, blob: bytes):
    path = tmp_path_factory.mktemp("h") / "f.safetensors"
    path.write_bytes(blob)
    with contextlib.suppress(CheckpointFormatError):   # anything else fails the property
        read_header(path)


@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_mutated_valid_files_only_raise_our_error(tmp_path_factory, edits):
    blob = bytearray(VALID)
    for pos, value in edits:
        blob[pos] = value
    _read_bytes(tmp_path_factory, bytes(blob))


@given(st.binary(max_size=200))
def test_random_bytes_only_raise_our_error(tmp_path_factory, blob):
    _read_bytes(tmp_path_factory, blob)


@given(st.binary(max_size=120))
def test_random_headers_only_raise_our_error(tmp_path_factory, header):
    _read_bytes(tmp_path_factory, struct.pack("<Q", len(header)) + header + bytes(16))


@given(st.integers(0, len(VALID)))
def test_truncated_valid_files_only_raise_our_error(tmp_path_factory, cut):
    _read_bytes(tmp_path_factory, VALID[:cut])
