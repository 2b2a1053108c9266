"""Config and metadata values that read as numbers or text but are not: verify fails on them, in both formats.

- a number that overflows a 64-bit float (`1e400` reads as infinity) or is NaN, at any key;
- a `torch_dtype` / `dtype` that names no dtype (`"bfloat17"`, `5`, `null`);
- `__metadata__` text with a lone surrogate escape, which the safetensors library refuses to open.
Each class has a passing twin.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format import contract

from .factories import tiny_config, write_checkpoint
from .spec_fixtures import copy_fixture, edit_config, set_key

SENTINEL = 123.456789


def verify(folder: Path) -> tuple[int, list[dict[str, Any]]]:
    result = CliRunner().invoke(cli, ["verify", str(folder), "--json"])
    return result.exit_code, json.loads(result.stdout)["findings"]


def _with_literal(folder: Path, literal: str) -> Path:
    """Replace the sentinel number in config.json by `literal` as it is (json.dumps cannot write 1e400)."""
    path = folder / "config.json"
    text = path.read_text()
    assert text.count(repr(SENTINEL)) == 1
    path.write_text(text.replace(repr(SENTINEL), literal))
    return folder


def _k3_with(tmp_path: Path, dotted: str, literal: str) -> Path:
    config = tiny_config()
    *parents, last = dotted.split(".")
    node = config
    for p in parents:
        node = node[p]
    node[last] = SENTINEL
    return _with_literal(write_checkpoint(tmp_path / "c", config=config), literal)


def _speculators_with(tmp_path: Path, dotted: str, literal: str) -> Path:
    return _with_literal(edit_config(copy_fixture(tmp_path, "dspark"), set_key(dotted, SENTINEL)), literal)


NON_FINITE = [
    ("rope_theta", "1e400"),
    ("rope_theta", "-1e400"),
    ("rms_norm_eps", "1e400"),
    ("rope_parameters.factor", "1e400"),
    ("rope_parameters.beta_fast", "-1E+999"),
    ("rope_parameters.rope_theta", "NaN"),
    ("max_position_embeddings", "1" + "0" * 400),
]
SPEC_NON_FINITE = [
    ("transformer_layer_config.rms_norm_eps", "1e400"),
    ("transformer_layer_config.rope_parameters.rope_theta", "-1e400"),
    ("speculators_config.proposal_methods", "1e999"),
    ("block_size", "Infinity"),
]


@pytest.mark.parametrize(("key", "literal"), NON_FINITE)
def test_k3_a_number_that_overflows_is_a_finding(tmp_path, key, literal):
    code, findings = verify(_k3_with(tmp_path, key, literal))
    assert code == 1
    assert ("CONFIG_INVALID_JSON", f"config.json:{key}") in {(f["code"], f["where"]) for f in findings}


@pytest.mark.parametrize(("key", "literal"), SPEC_NON_FINITE)
def test_speculators_a_number_that_overflows_is_a_finding(tmp_path, key, literal):
    code, findings = verify(_speculators_with(tmp_path, key, literal))
    assert code == 1
    assert ("CONFIG_INVALID_JSON", f"config.json:{key}") in {(f["code"], f["where"]) for f in findings}


@pytest.mark.parametrize(("key", "literal"), [("rope_theta", "1e300"), ("rms_norm_eps", "1e-400"),
                                              ("rope_parameters.factor", "3.9e2")])
def test_a_large_finite_number_is_not_refused_as_json(tmp_path, key, literal):
    """The twin: a finite value (or one that underflows to 0) reads as JSON; the value rules judge it."""
    _, findings = verify(_k3_with(tmp_path, key, literal))
    assert "CONFIG_INVALID_JSON" not in {f["code"] for f in findings}


def test_the_tiny_configs_verify(tmp_path):
    assert verify(write_checkpoint(tmp_path / "k3"))[0] == 0
    assert verify(copy_fixture(tmp_path, "dspark"))[0] == 0


BAD_DTYPES = ["bfloat17", 5, None, "auto", "BF16", ["bfloat16"]]


@pytest.mark.parametrize("value", BAD_DTYPES)
@pytest.mark.parametrize("key", contract.DTYPE_KEYS)
def test_k3_an_unknown_dtype_name_is_a_finding(tmp_path, key, value):
    config = tiny_config(**{key: value, **({"torch_dtype": ...} if key == "dtype" else {})})
    code, findings = verify(write_checkpoint(tmp_path / "c", config=config))
    assert code == 1
    assert ("CONFIG_RULE", f"config.json:{key}", "error") in {(f["code"], f["where"], f["severity"])
                                                              for f in findings}


@pytest.mark.parametrize("value", BAD_DTYPES)
def test_speculators_an_unknown_dtype_name_is_a_finding(tmp_path, value):
    code, findings = verify(edit_config(copy_fixture(tmp_path, "dspark"), set_key("dtype", value)))
    assert code == 1
    assert ("CONFIG_RULE", "config.json:dtype", "error") in {(f["code"], f["where"], f["severity"]) for f in findings}


@pytest.mark.parametrize("key", contract.DTYPE_KEYS)
def test_k3_a_known_dtype_name_passes(tmp_path, key):
    config = tiny_config(**{key: "bfloat16", **({"torch_dtype": ...} if key == "dtype" else {})})
    _, findings = verify(write_checkpoint(tmp_path / "c", config=config))
    assert not [f for f in findings if f["where"] == f"config.json:{key}"], findings


def test_speculators_a_missing_dtype_stays_a_warning(tmp_path):
    code, findings = verify(edit_config(copy_fixture(tmp_path, "dspark"), set_key("dtype", ...)))
    assert code == 0 and [f["severity"] for f in findings if f["where"] == "config.json:dtype"] == ["warning"]


LONE_SURROGATES = {
    "high_in_value": {"note": "a\ud800b"},
    "low_in_value": {"note": "\udc00"},
    "reversed_pair": {"note": "\udc00\ud800"},
    "in_the_key": {"n\ud801ote": "fine"},
}


def _with_metadata(folder: Path, metadata: dict[str, str]) -> Path:
    """Rewrite model.safetensors' header with `metadata` (json.dumps writes `\\ud800` as the escape)."""
    path = folder / contract.WEIGHTS_NAME
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    return folder


def _safetensors_opens(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            f.metadata()
        return True
    except Exception:   # whatever the library raises, it refused the file
        return False


@pytest.mark.parametrize("member", sorted(LONE_SURROGATES))
def test_metadata_with_a_lone_surrogate_is_a_finding(tmp_path, member):
    folder = _with_metadata(write_checkpoint(tmp_path / "c"), LONE_SURROGATES[member])
    assert not _safetensors_opens(folder / contract.WEIGHTS_NAME)    # the real library refuses it
    code, findings = verify(folder)
    # INVALID_METADATA from the header check; HEADER_NOT_UTF8 where the JSON loader refuses every lone surrogate
    assert code == 1 and {"INVALID_METADATA", "HEADER_NOT_UTF8"} & {f["code"] for f in findings if
                                                                     f["where"].startswith(contract.WEIGHTS_NAME)}


def test_metadata_with_a_surrogate_pair_passes(tmp_path):
    """The twin: `\\ud83d\\ude00` is one character (an emoji); safetensors and verify accept it."""
    folder = _with_metadata(write_checkpoint(tmp_path / "c"), {**contract.TORCHSPEC_METADATA, "note": "ok \U0001F600"})
    raw = (folder / contract.WEIGHTS_NAME).read_bytes()
    assert b"\\ud83d\\ude00" in raw
    assert _safetensors_opens(folder / contract.WEIGHTS_NAME)
    code, findings = verify(folder)
    assert code == 0 and "INVALID_METADATA" not in {f["code"] for f in findings}
