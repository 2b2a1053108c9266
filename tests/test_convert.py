"""convert SRC DST: near-miss exports become contract checkpoints; SRC is never touched; DST is all or nothing."""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from dspark_hub.cli.main import cli
from dspark_hub.errors import RefusedOverwriteError, UsageError
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
from dspark_hub.format.contract import TensorSpec
from dspark_hub.format.tensorio import f32_bits_to_bf16
from dspark_hub.ops.convert import convert, plan_tensors, repair_config
from dspark_hub.ops.init import init_checkpoint
from dspark_hub.verify.checks import verify

from .factories import tensors_for, tiny_config, tree_digest, write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
TRAINER = {v: k for k, v in contract.KNOWN_MISNAMES.items()}   # contract name -> trainer name


def trainer_export(config):
    """A trainer-style export: trainer names, `model.` prefix, an lm_head, everything F32."""
    good = tensors_for(config, dtype=torch.float32)
    state = {"model." + TRAINER.get(name, name): t for name, t in good.items()}
    state["lm_head.weight"] = torch.randn(config["vocab_size"], config["hidden_size"])
    return good, state


def messy_config(config):
    cfg = {k: v for k, v in config.items() if k not in ("_torchspec_version", "torch_dtype", "mla_use_nope")}
    keys = list(cfg)
    random.Random(0).shuffle(keys)
    cfg = {k: cfg[k] for k in keys}
    cfg.update(rope_interleave=True, dtype="float32", my_trainer_note="kept")
    return cfg


def test_trainer_named_prefixed_fp32_sharded_export_converts_and_verifies(tmp_path):
    good, state = trainer_export(contract.TINY_CONFIG)
    src = write_checkpoint(tmp_path / "src", config=messy_config(contract.TINY_CONFIG), tensors=state, shards=3,
                           metadata={"format": "pt"})
    assert not verify(src).ok
    before = tree_digest(src)

    report = convert(src, tmp_path / "dst")

    assert tree_digest(src) == before
    dst = tmp_path / "dst"
    assert sorted(p.name for p in dst.iterdir()) == ["config.json", "model.safetensors"]
    checked = verify(dst)
    assert checked.ok, checked.errors
    assert report.verify_ok
    reference = init_checkpoint(tmp_path / "tiny-ref", profile="tiny").path
    drop_in = verify(dst, drop_in=str(reference))   # unknown keys are kept, and a drop-in names them
    assert [(f.code, f.where) for f in drop_in.errors] == [("DROPIN_CONFIG_EXTRA_KEY", "config.json:my_trainer_note")]
    written = load_file(str(dst / contract.WEIGHTS_NAME))
    for name, tensor in good.items():   # bit-exact torch round-to-nearest-even
        assert torch.equal(written[name].view(torch.int16), tensor.to(torch.bfloat16).view(torch.int16)), name
    kinds = {(c.kind, c.target) for c in report.changes}
    assert ("drop", "lm_head.weight") in kinds
    assert ("strip_prefix", "model.fc.weight") in kinds
    assert ("cast", "context_proj.weight") in kinds
    assert ("config_remove", "rope_interleave") in kinds and ("config_remove", "dtype") in kinds
    assert ("config_add", "_torchspec_version") in kinds and ("merge", "model.safetensors") in kinds
    config = json.loads((dst / "config.json").read_text())
    assert list(config) == [*contract.TINY_CONFIG, "my_trainer_note"]
    assert config["torch_dtype"] == "bfloat16"


def test_reference_dimension_export_config_becomes_the_published_bytes():
    config, changes = repair_config(messy_config(contract.REFERENCE_CONFIG), {"BF16"})
    config.pop("my_trainer_note")
    assert contract.config_bytes(config) == contract.reference_config_bytes()
    assert {c.target for c in changes if c.kind == "config_add"} == {"_torchspec_version", "torch_dtype",
                                                                     "mla_use_nope"}


def test_reference_dimension_trainer_export_plans_the_published_layout(tmp_path):
    """At reference dimensions the planned header and config are the published ones, byte for byte.

    The export is a sparse file (header only), so nothing 7 GB is read or written.
    """
    specs = [TensorSpec("model." + TRAINER.get(n, n), s.shape, "F32")
             for n, s in contract.roster(contract.REFERENCE_CONFIG).items()]
    cfg = contract.REFERENCE_CONFIG
    specs.append(TensorSpec("lm_head.weight", (cfg["vocab_size"], cfg["hidden_size"]), "F32"))
    specs.sort(key=lambda s: s.name)
    header = contract.header_bytes(specs, {"format": "pt"})
    folder = tmp_path / "export"
    folder.mkdir()
    with open(folder / contract.WEIGHTS_NAME, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + sum(s.nbytes for s in specs))
    exported = messy_config(cfg)
    del exported["my_trainer_note"]
    (folder / "config.json").write_text(json.dumps(exported))

    view = open_checkpoint(LocalSource(folder))
    plans, _ = plan_tensors(view)
    config, _ = repair_config(view.config, {p.spec.dtype for p in plans})
    assert contract.config_bytes(config) == contract.reference_config_bytes()
    assert contract.header_bytes([p.spec for p in plans], contract.TORCHSPEC_METADATA) == \
        contract.expected_header(cfg)


def test_missing_dimension_key_is_not_invented():
    cfg = dict(contract.TINY_CONFIG)
    del cfg["hidden_size"], cfg["bos_token_id"]
    config, changes = repair_config(cfg, {"BF16"})
    assert "hidden_size" not in config and config["bos_token_id"] == contract.REFERENCE_CONFIG["bos_token_id"]
    assert [c.kind for c in changes if c.target == "hidden_size"] == ["config_note"]


def test_f32_to_bf16_rounding_matches_torch():
    special = np.array([0x3F808000, 0x3F818000, 0x3F80_7FFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
                        0x7FC00000, 0xFFC00001, 0x7F800001, 0x00000001, 0x80000000, 0x00008000], dtype=np.uint32)
    bits = np.concatenate([special, np.random.default_rng(0).integers(0, 2**32, 200_000, dtype=np.uint32)])
    ours = f32_bits_to_bf16(bits)
    theirs = torch.from_numpy(bits.view(np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(bits.view(np.float32))
    assert np.array_equal(ours[~nan], theirs[~nan])
    assert np.all((ours[nan] & 0x7FFF) > 0x7F80)   # NaN stays NaN (payload may differ)
    assert ours[0] == 0x3F80 and ours[1] == 0x3F82   # ties go to even


def test_f16_source_is_cast(tmp_path):
    state = tensors_for(contract.TINY_CONFIG, dtype=torch.float16)
    src = write_checkpoint(tmp_path / "src", tensors=state, config=tiny_config(torch_dtype="float16"))
    convert(src, tmp_path / "dst")
    written = load_file(str(tmp_path / "dst" / contract.WEIGHTS_NAME))
    name = "markov_head.markov_w1.weight"
    assert torch.equal(written[name], state[name].to(torch.bfloat16))
    assert verify(tmp_path / "dst").ok


def test_refusals(tmp_path):
    src = write_checkpoint(tmp_path / "src")
    (tmp_path / "dst").mkdir()
    with pytest.raises(RefusedOverwriteError):
        convert(src, tmp_path / "dst")
    convert(src, tmp_path / "dst", force=True)
    assert verify(tmp_path / "dst").ok
    for bad in (src, src / "inner", tmp_path):
        with pytest.raises(UsageError):
            convert(src, bad, force=True)
    assert (src / contract.WEIGHTS_NAME).exists()
    foreign = write_checkpoint(tmp_path / "foreign", config=tiny_config(model_type="llama"))
    with pytest.raises(UsageError, match="llama"):
        convert(foreign, tmp_path / "out")


def test_collision_is_refused(tmp_path):
    state = tensors_for(contract.TINY_CONFIG)
    state["model.final_norm.weight"] = state["final_norm.weight"].clone()
    with pytest.raises(UsageError, match=r"final_norm\.weight"):
        convert(write_checkpoint(tmp_path / "src", tensors=state), tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


def test_cli_convert(tmp_path):
    _, state = trainer_export(contract.TINY_CONFIG)
    src = write_checkpoint(tmp_path / "src", tensors=state)
    runner = CliRunner()
    result = runner.invoke(cli, ["convert", str(src), str(tmp_path / "dst"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "dspark-hub/convert/1" and doc["verify"]["ok"]
    assert doc["weights_bytes"] == (tmp_path / "dst" / contract.WEIGHTS_NAME).stat().st_size
    again = runner.invoke(cli, ["convert", str(src), str(tmp_path / "dst")])
    assert again.exit_code == 2 and "--force" in again.stderr
    human = runner.invoke(cli, ["convert", str(src), str(tmp_path / "dst"), "--force"])
    assert human.exit_code == 0 and "lm_head.weight" in human.stdout and "verify OK" in human.stdout


# ---------------------------------------------------------------- interruption

def _big_source(folder: Path) -> Path:
    """~100 MB of F32 so a conversion takes long enough to interrupt."""
    cfg = tiny_config(vocab_size=1 << 18, draft_vocab_size=1 << 18)
    return write_checkpoint(folder, config=cfg, tensors=tensors_for(cfg, dtype=torch.float32))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_interrupted_convert_leaves_src_intact_and_no_dst(tmp_path, sig):
    src = _big_source(tmp_path / "src")
    before = tree_digest(src)
    dst = tmp_path / "dst"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "dspark_hub", "convert", str(src), str(dst), "-q"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    expected = (src / contract.WEIGHTS_NAME).stat().st_size // 2
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        partial = list(tmp_path.glob(".dst.tmp-*/model.safetensors"))
        if partial and 0 < partial[0].stat().st_size < expected // 2:
            break
        assert proc.poll() is None, "convert finished before it could be interrupted"
        time.sleep(0.001)
    proc.send_signal(sig)
    rc = proc.wait(timeout=60)
    assert rc in (-sig, 128 + sig)
    assert not dst.exists()
    assert tree_digest(src) == before
    if sig == signal.SIGTERM:   # a catchable signal also cleans up the temporary folder
        assert not list(tmp_path.glob(".dst.tmp-*"))


def test_convert_exits_1_when_the_output_still_fails_verify(tmp_path):
    import json as _json

    import torch
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli
    from tests.factories import write_checkpoint

    def extra(t):
        t["mystery.weight"] = torch.zeros(4, dtype=torch.bfloat16)
    src = write_checkpoint(tmp_path / "src", mutate=extra)
    result = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / "dst"), "--json"])
    assert result.exit_code == 1, result.output
    assert _json.loads(result.stdout)["verify"]["ok"] is False and (tmp_path / "dst").is_dir()
