"""Loading, saving, registration and remote code for k3_dspark checkpoints (tiny real files)."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel

from dspark_hub.errors import CheckpointFormatError, RefusedOverwriteError
from dspark_hub.format import contract
from dspark_hub.modeling import (
    AUTO_MAP,
    K3DSparkConfig,
    K3DSparkModel,
    export_code,
    load_checkpoint,
    register,
    save_checkpoint,
)
from dspark_hub.verify.checks import verify
from tests.modeling_factory import tiny_config, write_tiny_checkpoint

pytestmark = pytest.mark.torch
REPO_ROOT = Path(__file__).resolve().parents[1]


def header(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict[str, str] | None]:
    with safe_open(str(path), framework="pt") as handle:
        layout = {name: (str(handle.get_slice(name).get_dtype()), tuple(handle.get_slice(name).get_shape()))
                  for name in handle.keys()}  # noqa: SIM118 (safe_open is not a dict)
        return layout, handle.metadata()


def test_automodel_loads_a_pristine_folder_with_no_missing_or_unexpected_keys(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "ckpt")
    assert "auto_map" not in json.loads((folder / "config.json").read_text())
    register()
    register()  # idempotent
    model, info = AutoModel.from_pretrained(folder, output_loading_info=True)
    assert isinstance(model, K3DSparkModel)
    assert isinstance(AutoConfig.from_pretrained(folder), K3DSparkConfig)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    on_disk = load_file(folder / "model.safetensors")
    state = model.state_dict()
    assert set(state) == set(on_disk) == set(contract.roster(contract.TINY_CONFIG))
    for name, tensor in on_disk.items():
        assert state[name].dtype == torch.bfloat16
        assert torch.equal(state[name], tensor), name


def test_rope_buffers_are_recomputed_after_meta_device_loading(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "ckpt")
    loaded = K3DSparkModel.from_pretrained(folder, dtype=torch.float32)
    fresh = K3DSparkModel(K3DSparkConfig.from_dict(dict(contract.TINY_CONFIG))).float()
    assert torch.equal(loaded.rotary_emb.inv_freq, fresh.rotary_emb.inv_freq)
    fresh.load_state_dict(loaded.state_dict())
    ids, context_states = torch.randint(0, 500, (1, 7)), torch.randn(1, 5, 192)
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids, context_states=context_states).last_hidden_state,
                           fresh.eval()(input_ids=ids, context_states=context_states).last_hidden_state)


@pytest.mark.parametrize("metadata", [contract.TORCHSPEC_METADATA, None])
def test_save_round_trip_keeps_names_shapes_dtypes_metadata_and_config_layout(tmp_path, metadata):
    source = write_tiny_checkpoint(tmp_path / "in", metadata=metadata)
    loaded = load_checkpoint(source)
    assert loaded.ok and loaded.metadata == metadata
    result = save_checkpoint(loaded.model, tmp_path / "out")
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert header(out / "model.safetensors") == header(source / "model.safetensors")
    saved, original = load_file(out / "model.safetensors"), load_file(source / "model.safetensors")
    assert all(torch.equal(saved[name], original[name]) for name in original)
    assert (out / "config.json").read_bytes() == (source / "config.json").read_bytes()
    assert result.tensor_count == 32 and result.metadata == metadata


def test_save_keeps_the_input_key_set_when_the_input_omits_contract_keys(tmp_path):
    config = tiny_config()
    del config["_torchspec_version"], config["num_key_value_heads"]
    config["aux_hidden_stream"] = "prefix"
    source = write_tiny_checkpoint(tmp_path / "in", config=config)
    loaded = load_checkpoint(source)
    save_checkpoint(loaded.model, tmp_path / "out", dtype=torch.float32)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert list(written) == list(config)
    assert written["torch_dtype"] == "float32"
    assert {dtype for dtype, _ in header(tmp_path / "out" / "model.safetensors")[0].values()} == {"F32"}


def test_save_pretrained_output_fails_drop_in_and_the_hint_names_convert(tmp_path):
    from dspark_hub.ops.convert import convert
    from dspark_hub.ops.diff import diff

    base = write_tiny_checkpoint(tmp_path / "base")
    register()
    AutoModel.from_pretrained(base, dtype=torch.bfloat16).save_pretrained(tmp_path / "hf")
    assert verify(tmp_path / "hf").ok
    report = verify(tmp_path / "hf", drop_in=str(base))
    codes = {f.code: f for f in report.errors}
    assert set(codes) == {"DROPIN_METADATA", "DROPIN_FILE_SIZE"}
    hint = codes["DROPIN_METADATA"].hint
    assert "'dspark-hub convert'" in hint and "save_pretrained" in hint
    assert "other metadata" in codes["DROPIN_FILE_SIZE"].message
    different = diff(base, tmp_path / "hf")
    assert different.differs == ["metadata"] and not different.changed
    convert(tmp_path / "hf", tmp_path / "fixed")
    assert verify(tmp_path / "fixed", drop_in=str(base)).ok


def test_save_of_a_fresh_model_uses_the_published_layout_and_refuses_to_overwrite(tmp_path):
    model = K3DSparkModel(K3DSparkConfig.from_dict(dict(contract.TINY_CONFIG))).to(torch.bfloat16)
    save_checkpoint(model, tmp_path / "out", metadata=contract.TORCHSPEC_METADATA)
    assert (tmp_path / "out" / "config.json").read_bytes() == contract.config_bytes(contract.TINY_CONFIG)
    with pytest.raises(RefusedOverwriteError):
        save_checkpoint(model, tmp_path / "out")
    save_checkpoint(model, tmp_path / "out", force=True)
    assert header(tmp_path / "out" / "model.safetensors")[1] is None


def test_load_checkpoint_is_strict_about_names_and_reports_them(tmp_path):
    source = write_tiny_checkpoint(tmp_path / "in", rename={"context_proj.weight": "fc.weight"})
    with pytest.raises(CheckpointFormatError) as raised:
        load_checkpoint(source)
    assert raised.value.code == "STATE_DICT_MISMATCH" and "fc.weight" in str(raised.value)
    lenient = load_checkpoint(source, strict=False)
    assert lenient.missing_keys == ["context_proj.weight"] and lenient.unexpected_keys == ["fc.weight"]


@pytest.mark.parametrize(("edit", "code", "words"), [
    (lambda text: text.replace('"hidden_size": 64', '"hidden_size": 64, "hidden_size": 64'), "CONFIG_DUPLICATE_KEY",
     "'hidden_size' appears twice"),
    (lambda text: text.replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN'), "CONFIG_INVALID_JSON",
     "rms_norm_eps is NaN"),
    (lambda text: "[1, 2]", "CONFIG_INVALID_JSON", "not an object"),
    (lambda text: text[:-3], "CONFIG_INVALID_JSON", "not valid JSON"),
], ids=["duplicate-key", "nan", "array", "truncated"])
def test_load_checkpoint_reads_the_config_as_strictly_as_verify(tmp_path, edit, code, words):
    source = write_tiny_checkpoint(tmp_path / "in")
    config = source / "config.json"
    config.write_text(edit(config.read_text()))
    with pytest.raises(CheckpointFormatError) as raised:
        load_checkpoint(source)
    assert raised.value.code == code and words in str(raised.value)
    assert str(raised.value).startswith(f"{config}: ")
    assert code in verify(source).codes()      # verify names the same problem with the same code


def test_export_code_adds_auto_map_and_files_idempotently(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "ckpt")
    first = export_code(folder)
    assert sorted(first.written) == ["config.json", "configuration_k3_dspark.py", "modeling_k3_dspark.py",
                                     "roster_k3_dspark.py"]
    roster_source = REPO_ROOT / "dspark_hub" / "format" / "roster_k3_dspark.py"
    assert (folder / "roster_k3_dspark.py").read_bytes() == roster_source.read_bytes()
    config = json.loads((folder / "config.json").read_text())
    assert list(config) == [*contract.TINY_CONFIG, "auto_map"] and config["auto_map"] == AUTO_MAP
    assert export_code(folder).written == []
    (folder / "modeling_k3_dspark.py").write_text("# edited\n")
    with pytest.raises(RefusedOverwriteError):
        export_code(folder)
    assert export_code(folder, force=True).written == ["modeling_k3_dspark.py"]
    assert not list(folder.glob(".*tmp*"))


@pytest.mark.slow        # a fresh process that imports torch and transformers: ~15 s
def test_exported_code_loads_with_trust_remote_code_where_dspark_hub_is_not_importable(tmp_path):
    folder = write_tiny_checkpoint(tmp_path / "ckpt")
    export_code(folder)
    torch.manual_seed(0)
    ids, context_states = torch.randint(0, 500, (1, 7)), torch.randn(1, 4, 192)
    torch.save({"ids": ids, "context": context_states}, tmp_path / "inputs.pt")
    # -S skips site-packages' .pth files, which is where an editable install of dspark-hub hooks in;
    # site-packages itself goes back on the path so torch and transformers still import.
    script = textwrap.dedent(f"""
        import sys
        sys.path.extend({site.getsitepackages()!r})
        import importlib.util, torch
        assert importlib.util.find_spec("dspark_hub") is None, "dspark_hub must not be importable here"
        from transformers import AutoModel
        model, info = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True,
                                               dtype=torch.float32, output_loading_info=True)
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        inputs = torch.load({str(tmp_path / "inputs.pt")!r})
        with torch.no_grad():
            out = model(input_ids=inputs["ids"], context_states=inputs["context"]).last_hidden_state
        torch.save(out, {str(tmp_path / "remote_out.pt")!r})
    """)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HOME=str(tmp_path / "hf"))
    run = subprocess.run([sys.executable, "-I", "-S", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    local = K3DSparkModel.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        expected = local(input_ids=ids, context_states=context_states).last_hidden_state
    assert torch.equal(torch.load(tmp_path / "remote_out.pt"), expected)


def test_importing_the_package_and_contract_loads_neither_torch_nor_transformers():
    code = ("import sys, dspark_hub, dspark_hub.contract; "
            "heavy = {'torch', 'transformers'} & set(sys.modules); print(sorted(heavy)); sys.exit(bool(heavy))")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
