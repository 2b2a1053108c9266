"""verify --deep (digests, NaN/inf, all-zero matrices, stats) and --frozen-embed (bit identity with a teacher)."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError
from dspark_hub.format import contract
from dspark_hub.format.reader import read_header
from dspark_hub.verify.checks import verify
from dspark_hub.verify.file_scan import scan_file
from dspark_hub.verify.tensor_stats import FileScanner

from .factories import file_digest, tensors_for, tiny_config, write_checkpoint

MATRIX = "layers.0.mlp.up_proj.weight"
BIAS = "confidence_head.proj.bias"
EMBED = "embed_tokens.weight"


def _set(name, index, value):
    def mutate(state):
        state[name] = state[name].clone()
        state[name][index] = value
    return mutate


def _codes_at(report, code):
    return [f.where for f in report.findings if f.code == code]


def test_nan_passes_header_level_and_fails_deep_naming_the_tensor(tmp_path):
    folder = write_checkpoint(tmp_path / "c", mutate=_set(MATRIX, (3, 5), float("nan")))
    assert verify(folder).ok
    report = verify(folder, deep=True)
    assert not report.ok
    assert _codes_at(report, "TENSOR_NAN") == [MATRIX]
    stats = report.to_dict()["sections"]["deep"]["tensors"][MATRIX]
    assert stats["nan"] == 1 and stats["inf"] == 0 and not stats["all_zero"]


def test_inf_is_an_error(tmp_path):
    folder = write_checkpoint(tmp_path / "c", mutate=_set(MATRIX, (0, 0), float("-inf")))
    report = verify(folder, deep=True)
    assert _codes_at(report, "TENSOR_INF") == [MATRIX]
    assert report.sections["deep"]["tensors"][MATRIX]["inf"] == 1


def test_all_zero_matrix_is_an_error_but_zero_bias_and_norm_are_not(tmp_path):
    def zero(*names):
        def mutate(state):
            for n in names:
                state[n] = torch.zeros_like(state[n])
        return mutate

    bad = verify(write_checkpoint(tmp_path / "m", mutate=zero(MATRIX)), deep=True)
    assert _codes_at(bad, "TENSOR_ALL_ZERO") == [MATRIX]
    fine = verify(write_checkpoint(tmp_path / "b", mutate=zero(BIAS, "final_norm.weight")), deep=True)
    assert fine.ok, fine.errors
    assert fine.sections["deep"]["tensors"][BIAS]["all_zero"] is True


def test_clean_checkpoint_passes_and_digest_is_the_file_sha256(tmp_path):
    folder = write_checkpoint(tmp_path / "c")
    report = verify(folder, deep=True)
    assert report.ok, report.errors
    (entry,) = report.sections["deep"]["files"]
    weights = folder / contract.WEIGHTS_NAME
    assert entry["sha256"] == file_digest(weights)
    assert entry["size"] == weights.stat().st_size
    assert set(report.sections["deep"]["tensors"]) == set(contract.roster(contract.TINY_CONFIG))


def test_sharded_checkpoint_scans_every_shard(tmp_path):
    folder = write_checkpoint(tmp_path / "c", shards=3, mutate=_set(MATRIX, (1, 1), float("nan")))
    report = verify(folder, deep=True)
    files = {f["name"]: f["sha256"] for f in report.sections["deep"]["files"]}
    assert files == {name: file_digest(folder / name) for name in files} and len(files) == 3
    assert _codes_at(report, "TENSOR_NAN") == [MATRIX]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("nans", [0, 1, 2])
def test_stats_match_torch(tmp_path, dtype, nans):
    state = tensors_for(contract.TINY_CONFIG, dtype=dtype)
    state[MATRIX] = (torch.randn(state[MATRIX].shape) * 3 + 0.5).to(dtype)
    for i in range(nans):     # excluded from the stats, counted
        state[MATRIX][2, 2 + i] = float("nan")
    folder = write_checkpoint(tmp_path / "c", tensors=state)
    got = verify(folder, deep=True).sections["deep"]["tensors"][MATRIX]
    x = state[MATRIX].double().flatten()
    x = x[torch.isfinite(x)]
    assert got["nan"] == nans
    assert got["mean"] == pytest.approx(x.mean().item(), rel=1e-4, abs=1e-6)
    assert got["std"] == pytest.approx(x.std(unbiased=False).item(), rel=1e-4)
    assert got["max_abs"] == x.abs().max().item()


def test_huge_values_keep_the_json_valid(tmp_path):
    folder = write_checkpoint(tmp_path / "c", mutate=_set(MATRIX, (0, 0), 3e38))
    report = verify(folder, deep=True)
    got = report.sections["deep"]["tensors"][MATRIX]
    assert report.ok and got["std"] is None and got["max_abs"] == pytest.approx(3e38, rel=1e-2)
    json.dumps(report.to_dict(), allow_nan=False)


def test_odd_chunk_boundaries_give_the_same_result(tmp_path):
    """Pieces that split elements (7 bytes) must carry the partial element over; small windows too."""
    folder = write_checkpoint(tmp_path / "c", tensors=tensors_for(contract.TINY_CONFIG, dtype=torch.float32))
    path = folder / contract.WEIGHTS_NAME
    header = read_header(path)
    whole = scan_file(path, header)
    windows = scan_file(path, header, chunk_bytes=4096, depth=2)
    assert windows.sha256 == whole.sha256 == file_digest(path)
    pieces = FileScanner(header, "x")
    data = path.read_bytes()
    for offset in range(0, len(data), 7):
        pieces.feed(offset, memoryview(data[offset:offset + 7]))
    for other in (windows.tensors, pieces.stats):
        for a, b in zip(whole.tensors, other, strict=True):
            assert (a.name, a.finite, a.max_bits) == (b.name, b.finite, b.max_bits)
            assert math.isclose(a.total_sq, b.total_sq, rel_tol=1e-5)


def test_progress_counts_every_byte(tmp_path):
    folder = write_checkpoint(tmp_path / "c", shards=2)
    seen = []
    verify(folder, deep=True, progress=seen.append)
    assert sum(seen) == sum(p.stat().st_size for p in folder.glob("*.safetensors"))


# ---------------------------------------------------------------- frozen embedding

def _teacher(folder, embed, name="model.embed_tokens.weight", shards=1):
    folder.mkdir(parents=True)
    other = {"model.layers.0.mlp.up_proj.weight": torch.randn(8, 4).to(torch.bfloat16),
             "lm_head.weight": torch.randn(embed.shape).to(torch.bfloat16)}
    if shards == 1:
        save_file({name: embed, **other}, str(folder / "model.safetensors"))
        return folder
    files = {"model-00001-of-00002.safetensors": other, "model-00002-of-00002.safetensors": {name: embed}}
    weight_map = {}
    for file, state in files.items():
        save_file(state, str(folder / file))
        weight_map.update({n: file for n in state})
    (folder / contract.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def test_identical_teacher_embedding_passes(tmp_path):
    state = tensors_for(contract.TINY_CONFIG)
    draft = write_checkpoint(tmp_path / "d", tensors=state)
    teacher = _teacher(tmp_path / "t", state[EMBED].clone())
    report = verify(draft, frozen_embed=teacher)
    assert report.ok, report.errors
    section = report.to_dict()["sections"]["frozen_embed"]
    assert section["identical"] is True
    assert section["draft"]["sha256"] == section["teacher_tensor"]["sha256"]
    assert section["teacher_tensor"]["location"].endswith("model.embed_tokens.weight")


def test_teacher_differing_in_one_element_fails_naming_both(tmp_path):
    state = tensors_for(contract.TINY_CONFIG)
    draft = write_checkpoint(tmp_path / "d", tensors=state)
    other = state[EMBED].clone()
    other[7, 3] = other[7, 3] + 1
    report = verify(draft, frozen_embed=_teacher(tmp_path / "t", other))
    (finding,) = [f for f in report.findings if f.code == "FROZEN_EMBED_MISMATCH"]
    assert finding.where == EMBED
    assert "model.embed_tokens.weight" in finding.message and "embed_tokens.weight" in finding.message
    assert report.sections["frozen_embed"]["identical"] is False


def test_sharded_teacher_found_through_its_index(tmp_path):
    state = tensors_for(contract.TINY_CONFIG)
    draft = write_checkpoint(tmp_path / "d", tensors=state)
    teacher = _teacher(tmp_path / "t", state[EMBED].clone(), name="language_model.model.embed_tokens.weight",
                       shards=2)
    section = verify(draft, frozen_embed=teacher).sections["frozen_embed"]
    assert section["identical"] is True
    assert "model-00002-of-00002.safetensors" in section["teacher_tensor"]["location"]


def test_same_bytes_other_dtype_is_a_mismatch(tmp_path):
    state = tensors_for(contract.TINY_CONFIG)
    draft = write_checkpoint(tmp_path / "d", tensors=state)
    as_f16 = state[EMBED].view(torch.float16)   # same bytes, different meaning
    report = verify(draft, frozen_embed=_teacher(tmp_path / "t", as_f16))
    assert "FROZEN_EMBED_MISMATCH" in report.codes()


def test_teacher_without_embedding_is_a_usage_error(tmp_path):
    draft = write_checkpoint(tmp_path / "d")
    (tmp_path / "t").mkdir()
    save_file({"foo.weight": torch.zeros(2, 2)}, str(tmp_path / "t" / "model.safetensors"))
    with pytest.raises(UsageError, match=r"model\.embed_tokens\.weight"):
        verify(draft, frozen_embed=tmp_path / "t")


# ---------------------------------------------------------------- CLI

def test_cli_deep_json_and_exit_codes(tmp_path):
    ok = write_checkpoint(tmp_path / "ok")
    bad = write_checkpoint(tmp_path / "bad", mutate=_set(MATRIX, (0, 1), float("nan")))
    runner = CliRunner()
    good = runner.invoke(cli, ["verify", str(ok), "--deep", "--json"])
    assert good.exit_code == 0, good.output
    doc = json.loads(good.stdout)
    assert doc["sections"]["deep"]["files"][0]["sha256"] == file_digest(ok / contract.WEIGHTS_NAME)
    failed = runner.invoke(cli, ["verify", str(bad), "--deep", "--json"])
    assert failed.exit_code == 1
    assert [f["where"] for f in json.loads(failed.stdout)["findings"] if f["code"] == "TENSOR_NAN"] == [MATRIX]
    human = runner.invoke(cli, ["verify", str(bad), "--deep"])
    assert human.exit_code == 1 and MATRIX in human.stdout and "sha256" in human.stdout


def test_cli_frozen_embed_missing_teacher_exits_2(tmp_path):
    draft = write_checkpoint(tmp_path / "d")
    result = CliRunner().invoke(cli, ["verify", str(draft), "--frozen-embed", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "nope" in result.stderr and result.stdout == ""


def test_cli_frozen_embed_mismatch_exits_1(tmp_path):
    state = tensors_for(tiny_config())
    draft = write_checkpoint(tmp_path / "d", tensors=state)
    teacher = _teacher(tmp_path / "t", torch.zeros_like(state[EMBED]))
    result = CliRunner().invoke(cli, ["verify", str(draft), "--frozen-embed", str(teacher), "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["sections"]["frozen_embed"]["identical"] is False


@pytest.mark.parametrize("code", ["<u2", "<u4", "<u8"])
def test_max_magnitude_is_the_largest_absolute_bit_pattern(code):
    import numpy as np

    from dspark_hub.verify.tensor_stats import max_magnitude

    width = np.dtype(code).itemsize * 8
    sign, mask = 1 << (width - 1), (1 << (width - 1)) - 1
    rng = np.random.default_rng(0)
    cases = [rng.integers(0, 1 << min(width, 63), 1000, dtype=np.uint64).astype(code),
             np.array([sign, sign + 1, 5], dtype=code),        # -0, the smallest negative, a positive
             np.array([sign + 7, sign + 3], dtype=code),       # negatives only
             np.array([0, sign], dtype=code),                  # +0 and -0
             np.array([mask, 1], dtype=code)]                  # the largest positive pattern (a NaN)
    for bits in cases:
        assert max_magnitude(bits) == int((bits & np.array(mask, dtype=code)).max())


def test_an_f32_teacher_and_its_exact_bf16_rounding_are_identical_after_rounding(tmp_path):
    teacher_values = torch.randn(contract.roster(contract.TINY_CONFIG)[EMBED].shape) * 0.02   # F32
    state = tensors_for(contract.TINY_CONFIG)
    state[EMBED] = teacher_values.to(torch.bfloat16)             # round to nearest even
    draft = write_checkpoint(tmp_path / "d", tensors=state)
    report = verify(draft, frozen_embed=_teacher(tmp_path / "t", teacher_values.clone()))
    assert report.ok, report.errors
    section = report.to_dict()["sections"]["frozen_embed"]
    assert section["identical"] is True and section["compared_as"] == "cast"
    assert section["verdict"] == "identical after BF16 rounding (nearest even) of the F32 target"
    assert section["teacher_tensor"]["dtype"] == "F32" and section["target_cast"]["dtype"] == "BF16"
    assert section["target_cast"]["sha256"] == section["draft"]["sha256"]
    human = CliRunner().invoke(cli, ["verify", str(draft), "--frozen-embed", str(tmp_path / "t")])
    assert human.exit_code == 0 and "identical after BF16 rounding (nearest even) of the F32 target" in human.stdout
    nudged = state[EMBED].clone()
    nudged.view(torch.int16)[3, 4] += 1          # one BF16 ulp off the rounding
    state[EMBED] = nudged
    other = write_checkpoint(tmp_path / "d2", tensors=state)
    report = verify(other, frozen_embed=tmp_path / "t")
    (finding,) = [f for f in report.findings if f.code == "FROZEN_EMBED_MISMATCH"]
    assert "identical to the BF16 rounding (nearest even) of the target's" in finding.message
    assert report.sections["frozen_embed"]["verdict"] == "different"


def test_same_dtype_is_still_compared_as_raw_bytes(tmp_path):
    state = tensors_for(contract.TINY_CONFIG)
    draft = write_checkpoint(tmp_path / "d", tensors=state)
    section = verify(draft, frozen_embed=_teacher(tmp_path / "t", state[EMBED].clone())).sections["frozen_embed"]
    assert (section["compared_as"], section["target_cast"], section["verdict"]) == ("bytes", None, "bit-identical")


def test_the_cast_digest_does_not_depend_on_where_the_stream_is_cut():
    from dspark_hub.format.tensorio import TensorDigest, digest_as

    values = torch.randn(1000) * 3
    raw = values.numpy().tobytes()
    stored = TensorDigest(location="x", dtype="F32", shape=(1000,), nbytes=len(raw), sha256="")
    whole = digest_as([raw], stored, "BF16")
    cut = digest_as([raw[i:i + 7] for i in range(0, len(raw), 7)], stored, "BF16")
    expected = hashlib.sha256(values.to(torch.bfloat16).view(torch.int16).numpy().tobytes()).hexdigest()
    assert whole == cut and whole.cast.sha256 == expected and whole.stored.sha256 == hashlib.sha256(raw).hexdigest()
