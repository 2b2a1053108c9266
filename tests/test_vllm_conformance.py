"""Conformance: vLLM's own draft loader, executed on CPU, against `verify --runtime vllm`'s rules, row by row.

Every case of `tests/vllm_matrix.py` (both DSpark formats: the conforming drafts, each class of defect,
each config refusal) is built in a temporary folder and loaded through vLLM's real loader by
`verify.execute_vllm.execute`, all in this one process (vLLM is imported once). Each row (the start-up
refusal, every tensor's verdict, every parameter's fate) must equal what the static rules say.

Needs vLLM: `$(.ci/venv-vllm.sh) -m pytest -m vllm tests/test_vllm_conformance.py` (`.ci/run` does).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dspark_hub.cli.main import cli
from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
from dspark_hub.verify.execute_vllm import PINNED_VERSION, as_verdicts, execute
from dspark_hub.verify.family import detect
from dspark_hub.verify.runtimes import findings, loaders_for
from dspark_hub.verify.verdicts import compare

from .factories import write_checkpoint
from .vllm_matrix import CASES, build

pytestmark = pytest.mark.vllm

@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """case -> (folder, ExecutedLoad), every case built and executed in this process (its time:
    `bench/bench_vllm_matrix.py`)."""
    root = tmp_path_factory.mktemp("vllm-matrix")
    return {case: (folder, execute(folder)) for case in CASES for folder in [build(case, root / case)]}


def static_and_executed(folder, executed):
    view = open_checkpoint(LocalSource(folder))
    fmt, _ = detect(view.config, view.tensors)
    spec = loaders_for(fmt)["vllm"]
    present = {n: (tuple(info.shape), info.dtype) for n, (_, info) in view.tensors.items()}
    return spec.verdicts(present, view.config), as_verdicts(executed, spec)


@pytest.mark.parametrize("case", list(CASES))
def test_every_row_agrees_with_the_rules(matrix, case):
    folder, executed = matrix[case]
    assert executed.vllm_version == PINNED_VERSION
    rules, measured = static_and_executed(folder, executed)
    rows = compare(rules, measured)
    assert [row.to_dict() for row in rows if not row.agree] == [], CASES[case][0]
    # the executed result reports through the same codes, naming every never-written parameter
    codes = {f.code for f in findings(measured)}
    unfilled = measured.unfilled_names("ignored")
    if measured.refusal is not None:
        assert codes == {"RUNTIME_CONFIG_REFUSED" if measured.refusal["stage"] == "config" else "RUNTIME_LOAD_FAILS"}
    elif not measured.loads:
        assert codes == {"RUNTIME_LOAD_FAILS"}
    elif unfilled or measured.names("ignored"):
        (drop,) = [f for f in findings(measured) if f.code == "RUNTIME_SILENT_DROP"]
        for name in unfilled[:6]:
            assert name in drop.message
        if unfilled:
            assert "vLLM" in drop.message and "starts and serves with" in drop.message
    else:
        assert codes == {"RUNTIME_LOADS"}


def test_the_whole_matrix_runs_in_one_process(matrix):
    rows = sum(len(compare(*static_and_executed(folder, executed))) for folder, executed in matrix.values())
    assert len(matrix) >= 100 and rows > 3000
    assert {executed.format for _, executed in matrix.values()} == {"k3_dspark", "speculators_dspark"}


def test_stubs_and_shims_are_named_in_every_result(matrix):
    for _, executed in matrix.values():
        assert set(executed.stubs) == {"STUB_TARGET_CONFIG", "STUB_TARGET_MODEL", "STUB_V1_RUNNER_GATE"}
        assert "SHIM_NO_RETRY_SLEEP" in executed.shims
    k3_starts = [e for _, e in matrix.values() if e.format == "k3_dspark" and e.starts]
    assert all("SHIM_CPU_KV_B_PROJ" in e.shims for e in k3_starts)


def test_a_missing_projection_serves_silently(matrix):
    """The headline: vLLM starts with a projection never written, and says nothing."""
    _, executed = matrix["k3_missing_l0_mlp_gate_proj"]
    assert executed.starts and executed.unfilled() == {"layers.0.mlp.gate_proj.weight": "ignored"}
    _, kv = matrix["k3_missing_l0_self_attn_kv_a_proj_with_mqa"]
    assert kv.unfilled() == {"layers.0.self_attn.kv_a_proj_with_mqa.weight": "ignored",
                             "context_kv_proj.weight[shard 0]": "ignored"}
    _, norm = matrix["k3_missing_final_norm"]
    assert norm.outcome == "fails at the strict check" and norm.unfilled() == {"final_norm.weight": "fatal"}


# ---------------------------------------------------------------- verify --execute (a child process each)

def test_cli_execute_on_the_conforming_draft(tmp_path):
    folder = build("k3_conforming", tmp_path / "ok")
    result = CliRunner().invoke(cli, ["verify", str(folder), "--runtime", "vllm", "--execute", "--json"])
    assert result.exit_code == 0, result.output
    section = json.loads(result.stdout)["sections"]["runtimes"]["vllm"]
    assert section["executed"] is True and section["execution"]["vllm_version"] == PINNED_VERSION
    assert section["measured_by"].startswith(f"vLLM {PINNED_VERSION}") and section["rules_agree"] is True
    assert section["unfilled"] == [] and section["counts"]["loaded"] == 31


def test_cli_execute_names_every_never_written_parameter(tmp_path):
    gone = ["layers.0.mlp.gate_proj.weight", "context_proj.weight", "layers.1.self_attn.kv_a_proj_with_mqa.weight",
            "markov_head.markov_w2.weight", "confidence_head.proj.bias", "layers.0.self_attn.o_proj.weight",
            "layers.1.mlp.down_proj.weight"]
    folder = write_checkpoint(tmp_path / "bad", mutate=lambda t: [t.pop(n) for n in gone])
    result = CliRunner().invoke(cli, ["verify", str(folder), "--runtime", "vllm", "--execute"])
    assert result.exit_code == 1
    never = [*gone, "context_kv_proj.weight[shard 1]"]
    for name in never:
        assert f"{name} (unfilled)" in result.stdout, name
    assert "vLLM starts and serves with" in result.stdout and "executed" in result.stdout


def test_an_internal_that_moved_fails_loudly(monkeypatch):
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from dspark_hub.verify.execute_vllm import VllmInternalsMoved, check_internals

    monkeypatch.delattr(DefaultModelLoader, "track_weights_loading")
    with pytest.raises(VllmInternalsMoved, match=r"DefaultModelLoader\.track_weights_loading"):
        check_internals()


def test_execute_never_imports_the_checkpoints_config_py(tmp_path):
    """A speculators draft's auto_map names a config.py; vLLM's loader runs with trust_remote_code=False."""
    from .spec_fixtures import copy_fixture, read_config

    folder = copy_fixture(tmp_path, "dspark")
    marker = tmp_path / "config-py-was-imported"
    config = read_config(folder)
    config["auto_map"] = {"AutoConfig": "config.DSparkSpeculatorConfig", "AutoModel": "config.DSparkSpeculatorConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "config.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n"
                                      "class DSparkSpeculatorConfig:\n    pass\n")
    result = CliRunner().invoke(cli, ["verify", str(folder), "--runtime", "vllm", "--execute", "--json"])
    assert result.exit_code == 0, result.output
    section = json.loads(result.stdout)["sections"]["runtimes"]["vllm"]
    assert section["executed"] is True and section["rules_agree"] is True
    assert not marker.exists()
