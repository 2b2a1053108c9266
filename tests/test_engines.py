"""Teacher engines without vLLM: the registry, the id conversion, the final norm, prefill mode, resume rules.

The real vLLM engine is exercised in `test_engine_vllm.py` (marker `vllm`).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from dspark_hub.errors import MissingDependencyError, RefusedOverwriteError, UsageError
from dspark_hub.train.data.rollouts import RolloutData, make_rollouts
from dspark_hub.train.target.engines import ENGINES, EngineOptions, engine_names, open_engine
from dspark_hub.train.target.generate import capture_states, greedy_agreement
from dspark_hub.train.target.target import Target, load_target
from dspark_hub.train.target.vllm_engine import tap_columns, vllm_layer_ids

from .teacher_factory import teacher_config, write_draft_base, write_prompts

VLLM_IMPORTABLE = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A random tiny teacher (untrained: these tests need shapes, not a language) and a draft on it."""
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("engines")
    torch.manual_seed(0)
    LlamaForCausalLM(teacher_config()).save_pretrained(str(root / "teacher"))
    base = write_draft_base(root / "base", root / "teacher")
    return {"root": root, "teacher": root / "teacher", "base": base,
            "config": json.loads((base / "config.json").read_text())}


def test_the_registry_names_the_engines_and_refuses_options_an_engine_does_not_take(small):
    assert engine_names() == sorted(ENGINES) == ["transformers", "vllm"]
    with pytest.raises(UsageError, match="target engine 'sglang': unknown; use one of transformers, vllm"):
        open_engine("sglang", str(small["teacher"]), [1, 3, 4])
    with pytest.raises(UsageError, match="'transformers' does not take max_num_seqs, tensor_parallel_size"):
        open_engine("transformers", str(small["teacher"]), [1, 3, 4],
                    EngineOptions(tensor_parallel_size=2, max_num_seqs=4))
    with pytest.raises(UsageError, match="'vllm' does not take device"):
        open_engine("vllm", str(small["teacher"]), [1, 3, 4], EngineOptions(device="cpu"))
    with pytest.raises(UsageError, match=r"gpu_memory_utilization: 1\.5"):
        open_engine("vllm", str(small["teacher"]), [1, 3, 4], EngineOptions(gpu_memory_utilization=1.5))


@pytest.mark.parametrize("taps,layers,ids,columns", [
    ([1, 3, 4], 6, [2, 4, 5, 6], [0, 1, 2]),                        # TINY: ours l = vLLM l + 1, plus the last
    ([2, 23, 47, 71, 89], 93, [3, 24, 48, 72, 90, 93], [0, 1, 2, 3, 4]),   # Inferact Kimi-K3-DSpark
    ([4, 1], 6, [2, 5, 6], [0, 1]),                                 # unsorted taps: ascending columns
    ([1, 5], 6, [2, 6], [0, 1]),                                    # the last layer's output shares id 6
])
def test_our_tap_l_is_vllm_aux_id_l_plus_one_and_the_last_layer_is_always_extracted(taps, layers, ids, columns):
    assert vllm_layer_ids(taps, layers) == ids
    assert tap_columns(taps, ids) == columns


def test_the_final_norm_from_the_weights_is_transformers_own_final_norm(small):
    model = load_target(small["teacher"])
    norm = Target.open(small["teacher"]).final_norm()
    assert norm.tensor == "model.norm.weight" and norm.eps == model.config.rms_norm_eps
    x = torch.randn(3, 5, 64) * 4
    for dtype in (torch.float32, torch.bfloat16):
        reference = model.model.norm.to(dtype)(x.to(dtype))
        assert torch.equal(norm(x.to(dtype)), reference), dtype
    model.model.norm.float()
    ids = torch.tensor([[5, 9, 33, 70, 11, 12]])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    states = capture_states(model, ids, [5])                       # layer 5's output = the pre-norm last state
    assert torch.equal(norm(states.aux_hidden_states), out.hidden_states[-1])


def test_eos_ids_come_from_the_generation_config_then_the_config(small, tmp_path):
    assert Target.open(small["teacher"]).eos_ids == []              # the factory's teacher has none
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert Target.open(tmp_path).eos_ids == [2]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    assert Target.open(tmp_path).eos_ids == [7, 2]


def test_greedy_agreement_counts_supervised_tokens_whose_previous_row_argmax_is_them():
    head = torch.eye(4)
    final = torch.tensor([[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0.]])
    tokens = torch.tensor([0, 1, 2, 0])
    assert greedy_agreement(final, tokens, torch.tensor([0, 1, 1, 1]), head) == (2, 3)
    assert greedy_agreement(final, tokens, torch.tensor([0, 0, 0, 0]), head) == (0, 0)


def test_prefill_mode_records_given_sequences_with_their_loss_masks(small, tmp_path):
    prompts = tmp_path / "seqs.jsonl"
    rows = [{"input_ids": [5, 6, 7, 8, 9, 10], "loss_mask": [0, 0, 1, 1, 1, 0]},
            {"input_ids": [11, 12, 13, 14]}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = make_rollouts(small["teacher"], prompts, small["config"], tmp_path / "data", max_new_tokens=99,
                            mode="prefill")
    data = RolloutData(tmp_path / "data")
    by_index = {r.prompt_index: r for r in data}
    assert by_index[0].input_ids.tolist() == rows[0]["input_ids"]
    assert by_index[0].loss_mask.tolist() == rows[0]["loss_mask"] and by_index[0].prompt_length == 2
    assert by_index[1].loss_mask.tolist() == [1, 1, 1, 1] and by_index[1].prompt_length == 0
    assert summary.continuation_tokens == 3 + 4
    settings = data.manifest["settings"]
    assert (settings["mode"], settings["max_new_tokens"], settings["engine"]) == ("prefill", 0, "transformers")
    assert data.manifest["engine"]["name"] == "transformers"
    model = load_target(small["teacher"])
    states = capture_states(model, torch.tensor([rows[0]["input_ids"]]), [1, 3, 4])
    assert torch.equal(by_index[0].aux_hidden_states, states.aux_hidden_states[0].to(torch.bfloat16))
    with pytest.raises(UsageError, match="prompt 0 has a loss_mask, which only prefill mode reads"):
        make_rollouts(small["teacher"], prompts, small["config"], tmp_path / "gen", max_new_tokens=4)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"input_ids": [5, 6], "loss_mask": [1]}) + "\n")
    with pytest.raises(UsageError, match="loss_mask must be a list of 0/1, one per input_ids token"):
        make_rollouts(small["teacher"], tmp_path / "bad.jsonl", small["config"], tmp_path / "x", max_new_tokens=4,
                      mode="prefill")


def test_resume_refuses_another_engine_and_reads_manifests_from_before_engines(small, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", count=3, seed=1)
    make_rollouts(small["teacher"], prompts, small["config"], tmp_path / "d", max_new_tokens=4)
    with pytest.raises(RefusedOverwriteError, match="setting engine was 'transformers' and is now 'vllm'"):
        make_rollouts(small["teacher"], prompts, small["config"], tmp_path / "d", max_new_tokens=4, engine="vllm",
                      engine_options=EngineOptions(python=sys.executable))   # vLLM not needed: refused first
    with pytest.raises(RefusedOverwriteError, match="setting engine_dtype was 'float32' and is now 'bfloat16'"):
        make_rollouts(small["teacher"], prompts, small["config"], tmp_path / "d", max_new_tokens=4,
                      engine_options=EngineOptions(dtype="bfloat16"))
    manifest_path = tmp_path / "d" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for key in ("mode", "engine", "engine_dtype"):                  # a folder written before engines existed
        del manifest["settings"][key]
    manifest_path.write_text(json.dumps(manifest))
    summary = make_rollouts(small["teacher"], prompts, small["config"], tmp_path / "d", max_new_tokens=4)
    assert (summary.written, summary.skipped) == (0, 3)


@pytest.mark.skipif(VLLM_IMPORTABLE, reason="vllm is importable here")
def test_the_vllm_engine_without_vllm_names_how_to_install_it(small, tmp_path):
    prompts = write_prompts(tmp_path / "p.jsonl", count=2, seed=1)
    for options in (EngineOptions(), EngineOptions(python=sys.executable)):   # this process, then a child
        with pytest.raises(MissingDependencyError) as caught:
            make_rollouts(small["teacher"], prompts, small["config"], tmp_path / "d", max_new_tokens=4,
                          engine="vllm", engine_options=options, force=True)
        message = str(caught.value)
        assert "\n" not in message and "pip install 'dspark-hub[vllm]'" in message and ".ci/venv-vllm.sh" in message
    assert not list(Path(tmp_path / "d").glob("shard-*"))


# ----------------------------------------------------------------------------- the CLI


def test_rollouts_passes_the_engine_and_its_options_through(small, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli
    from dspark_hub.train.data import rollouts
    opened = []

    def recording_open_engine(name, teacher, layer_ids, options=None, **kwargs):
        opened.append((name, layer_ids, options))
        return open_engine("transformers", teacher, layer_ids, EngineOptions(dtype=options.dtype))

    monkeypatch.setattr(rollouts, "open_engine", recording_open_engine)
    prompts = write_prompts(tmp_path / "p.jsonl", count=2, seed=1)
    result = CliRunner().invoke(cli, ["rollouts", "--teacher", str(small["teacher"]), "--prompts", str(prompts),
                                      "--draft-config", str(small["base"] / "config.json"), "--out",
                                      str(tmp_path / "d"), "--max-new-tokens", "3", "--engine", "vllm",
                                      "--engine-dtype", "float32", "--tensor-parallel-size", "8",
                                      "--max-model-len", "4096", "--max-num-seqs", "64",
                                      "--max-num-batched-tokens", "8192", "--gpu-memory-utilization", "0.85",
                                      "--engine-python", "/opt/vllm/bin/python",
                                      "--engine-arg", "enable_chunked_prefill=false",
                                      "--engine-arg", "quantization=fp8",
                                      "--json"])
    assert result.exit_code == 0, result.output
    (name, taps, options), = opened
    assert (name, taps) == ("vllm", [1, 3, 4])
    assert options == EngineOptions(dtype="float32", tensor_parallel_size=8, max_model_len=4096, max_num_seqs=64,
                                    max_num_batched_tokens=8192, gpu_memory_utilization=0.85,
                                    python="/opt/vllm/bin/python",
                                    engine_args={"enable_chunked_prefill": False, "quantization": "fp8"})
    assert json.loads(result.stdout)["mode"] == "generate"


@pytest.mark.skipif(VLLM_IMPORTABLE, reason="vllm is importable here")
def test_rollouts_with_the_vllm_engine_and_no_vllm_is_a_one_line_error(small, tmp_path):
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli

    from .cli_errors import assert_one_line_error

    prompts = write_prompts(tmp_path / "p.jsonl", count=2, seed=1)
    result = CliRunner().invoke(cli, ["rollouts", "--teacher", str(small["teacher"]), "--prompts", str(prompts),
                                      "--draft-config", str(small["base"] / "config.json"), "--out",
                                      str(tmp_path / "d"), "--engine", "vllm"])
    assert_one_line_error(result, "the vllm target engine needs vLLM 0.32", "pip install 'dspark-hub[vllm]'")
