"""Family fingerprint: each public draft layout is named, and verify says so in one finding."""

from __future__ import annotations

import pytest
import torch

from dspark_hub.format import contract
from dspark_hub.verify.checks import verify
from dspark_hub.verify.family import FAMILIES, fingerprint

from .factories import write_checkpoint

GQA_LAYER = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
             "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
             "input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
             "mlp.up_proj.weight", "mlp.down_proj.weight"]
HEADS = ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
         "confidence_head.proj.bias"]


def gqa_body(layers=2):
    return [f"layers.{i}.{n}" for i in range(layers) for n in GQA_LAYER] + ["fc.weight", "hidden_norm.weight",
                                                                             "norm.weight"]


#: family -> (config, tensor names), from the public layouts named in dspark_hub/family.py.
LAYOUTS = {
    "speculators_dspark": ({"architectures": ["DSparkSpeculator"], "speculators_model_type": "dspark",
                            "block_size": 8, "speculators_config": {"algorithm": "dspark"}}, gqa_body() + HEADS),
    "gqa_dspark": ({"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "block_size": 7},
                   gqa_body() + HEADS[:2]),
    "dflash": ({"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
                "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17]}}, gqa_body()),
    "eagle3": ({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama"},
               ["fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
                "midlayer.self_attn.q_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight",
                "lm_head.weight", "d2t", "t2d"]),
    "mtp": ({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
             "num_nextn_predict_layers": 1},
            ["model.layers.61.eh_proj.weight", "model.layers.61.enorm.weight", "model.layers.61.hnorm.weight",
             "model.layers.61.shared_head.head.weight", "model.layers.61.self_attn.q_a_proj.weight"]),
}


def folder_for(tmp_path, family):
    config, names = LAYOUTS[family]
    return write_checkpoint(tmp_path / family, config=config, tensors={n: torch.zeros(2) for n in names})


@pytest.mark.parametrize("family", sorted(LAYOUTS))
def test_each_public_layout_is_named(family):
    config, names = LAYOUTS[family]
    assert fingerprint(config, names).family == family
    assert fingerprint(None, names).family == (family if family != "speculators_dspark" else "gqa_dspark")


def test_k3_dspark_and_its_trainer_named_export_stay_k3():
    names = list(contract.roster(contract.TINY_CONFIG))
    assert fingerprint(contract.TINY_CONFIG, names).family == "k3_dspark"
    trainer = [{"context_proj.weight": "fc.weight", "context_norm.weight": "hidden_norm.weight",
                "final_norm.weight": "norm.weight"}.get(n, n) for n in names]
    assert fingerprint(None, trainer).family == "k3_dspark"
    assert fingerprint({"model_type": "mystery"}, []).family == "unknown"


@pytest.mark.parametrize("family", ["gqa_dspark", "dflash", "eagle3", "mtp"])
def test_verify_names_the_family_instead_of_a_wall_of_missing_tensors(tmp_path, family):
    report = verify(folder_for(tmp_path, family))
    errors = [f for f in report.findings if f.severity == "error"]
    assert [f.code for f in errors] == ["FOREIGN_DRAFT_FAMILY"]
    assert errors[0].message.startswith(f"this is {FAMILIES[family].title}, not a draft format dspark-hub verifies")
    method = FAMILIES[family].methods["vllm"]
    assert f"vllm {method}" in errors[0].hint
    assert report.sections["family"]["family"] == family


def test_k3_config_over_a_gqa_body_is_named(tmp_path):
    _, names = LAYOUTS["gqa_dspark"]
    folder = write_checkpoint(tmp_path / "lie", config=contract.TINY_CONFIG,
                              tensors={n: torch.zeros(2) for n in names})
    report = verify(folder)
    assert {f.code for f in report.errors} == {"FOREIGN_DRAFT_FAMILY"}
    assert "although config.json says k3_dspark" in report.errors[0].message


def test_speculators_dspark_is_verified_as_its_own_format_with_no_foreign_family_finding(tmp_path):
    report = verify(folder_for(tmp_path, "speculators_dspark"), runtime="all")
    assert report.summary.format == "speculators_dspark"
    assert not {"FOREIGN_DRAFT_FAMILY", "WRONG_MODEL_TYPE"} & report.codes()
    assert report.sections["family"]["methods"]["sglang"] is None     # sglang refuses that convention


def test_k3_folder_without_runtime_has_no_family_section(tmp_path):
    assert verify(write_checkpoint(tmp_path / "ok")).sections.get("family") is None


def test_a_plain_causal_lm_is_not_called_a_drafter_and_its_line_has_no_empty_evidence():
    from click.testing import CliRunner

    from dspark_hub.cli.main import cli

    from .spec_fixtures import VERIFIER

    result = CliRunner().invoke(cli, ["verify", str(VERIFIER)])
    assert result.exit_code == 1
    assert "family: not a recognised draft family\n" in result.stdout and "()" not in result.stdout


@pytest.mark.parametrize("name, family", [("dflash2", "speculators_dflash2"), ("xpress", "speculators_xpress"),
                                          ("mtp", "speculators_mtp")])
def test_without_its_declared_type_a_speculators_layout_is_named_by_its_tensors(name, family):
    import json

    from safetensors import safe_open

    from .spec_fixtures import fixture

    config = json.loads((fixture(name) / "config.json").read_text())
    config.pop("speculators_model_type")
    with safe_open(str(fixture(name) / "model.safetensors"), "np") as f:
        names = list(f.keys())
    assert fingerprint(config, names).family == family
