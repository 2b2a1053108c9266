"""The speculators DSpark contract against checkpoints the real library saved: roster, counts, families."""

from __future__ import annotations

import pytest

from dspark_hub.errors import ContractError
from dspark_hub.format import contract, speculators
from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
from dspark_hub.verify.family import FAMILIES, family_from_names, fingerprint
from dspark_hub.verify.runtimes import loaders_for

from .spec_fixtures import DSPARK, FAMILY_OF, MANIFEST, fixture, read_config


def present(name):
    view = open_checkpoint(LocalSource(fixture(name)))
    return view, {n: (tuple(i.shape), i.dtype) for n, (_, i) in view.tensors.items()}


def test_manifest_records_the_library_and_no_library_source():
    assert MANIFEST["speculators_version"] == "0.9.0" and MANIFEST["torch_version"].startswith("2.13.0")
    for name, entry in MANIFEST["fixtures"].items():
        assert "config.py" not in entry["files"], name
        assert not (fixture(name) / "config.py").exists(), name
        if entry["family"] != "verifier":
            assert set(entry["removed"]) == {"config.py"}, name   # the library wrote it; we deleted it
    assert MANIFEST["twins"]["dspark-ckpt-bf16"]["byte_identical"] is True


@pytest.mark.parametrize("name", DSPARK)
def test_roster_is_exactly_what_the_library_saved(name):
    _, got = present(name)
    expected = {n: (s.shape, s.dtype) for n, s in speculators.roster(read_config(fixture(name))).items()}
    assert got == expected


def test_parameter_counts_keep_maps_and_frozen_rows_apart():
    _, dense = present("dspark")
    counts = speculators.count_parameters({n: s for n, (s, _) in dense.items()})
    assert counts == contract.ParameterCounts(total=94_801, frozen=0, trained=94_801, maps=0)
    _, pruned = present("dspark-pruned-vocab")
    counts = speculators.count_parameters({n: s for n, (s, _) in pruned.items()})
    assert counts.frozen == 64 * 64                       # lm_head: the verifier's rows picked by t2d
    assert counts.maps == 64 + 256                         # d2t [Vd] int64, t2d [V] bool: not parameters
    assert counts.trained + counts.frozen == counts.total
    assert counts.to_dict() == {"total": counts.total, "trained": counts.trained, "frozen": 4096, "maps": 320}


def test_roster_formula_follows_the_config():
    config = read_config(fixture("dspark"))
    g = speculators.geometry(config)
    assert (g.hidden_size, g.heads, g.kv_heads, g.head_dim, g.taps, g.tap_width) == (64, 2, 1, 32, 3, 64)
    roster = speculators.roster(config)
    assert roster["fc.weight"].shape == (64, 3 * 64)
    assert roster["layers.1.self_attn.k_proj.weight"].shape == (32, 64)       # GQA: 1 KV head x 32
    assert roster["confidence_head.proj.weight"].shape == (1, 64 + 16)
    assert len(roster) == 3 + 11 * 2 + 2 + 2 and "embed_tokens.weight" not in roster
    wide = dict(config, target_hidden_size=128)
    assert speculators.roster(wide)["fc.weight"].shape == (64, 3 * 128)        # vLLM's sizing
    assert speculators.roster(dict(config, dtype="float32"))["fc.weight"].dtype == "F32"


@pytest.mark.parametrize("change,key", [
    (lambda c: c.pop("transformer_layer_config"), "transformer_layer_config"),
    (lambda c: c["transformer_layer_config"].update(hidden_size=0), "transformer_layer_config.hidden_size"),
    (lambda c: c["transformer_layer_config"].update(model_type="llama"), "transformer_layer_config.model_type"),
    (lambda c: c.update(aux_hidden_state_layer_ids=[]), "aux_hidden_state_layer_ids"),
    (lambda c: c.update(markov_rank=0), "confidence_head_with_markov"),
    (lambda c: c.update(markov_head_type="lstm"), "markov_head_type"),
])
def test_undecidable_rosters_name_the_key(change, key):
    config = read_config(fixture("dspark"))
    change(config)
    with pytest.raises(ContractError) as e:
        speculators.roster(config)
    assert e.value.key == key


@pytest.mark.parametrize("name", sorted(FAMILY_OF))
def test_every_fixture_is_fingerprinted_by_its_declared_type(name):
    view, _ = present(name)
    found = fingerprint(view.config, view.tensors)
    assert found.family == f"speculators_{FAMILY_OF[name]}"
    assert found.evidence[0] == f"config.json speculators_model_type {FAMILY_OF[name]!r}"
    assert found.to_dict()["format"] == "speculators"


@pytest.mark.parametrize("name,by_names", [
    ("dspark", "gqa_dspark"), ("dspark-pruned-vocab", "gqa_dspark"),   # d2t/t2d do not make it EAGLE-3
    ("dspark-markov-off", "dflash"), ("dflash", "dflash"),
    ("dflash2", "speculators_dflash2"), ("xpress", "speculators_xpress"), ("peagle", "speculators_peagle"),
    ("eagle3", "speculators_eagle3"), ("eagle3-pruned-vocab", "speculators_eagle3"), ("mtp", "speculators_mtp"),
])
def test_names_alone_say_what_they_can(name, by_names):
    view, _ = present(name)
    assert family_from_names(view.tensors)[0] == by_names


def test_a_dflash_and_a_markov_off_dspark_are_the_same_bytes_only_the_config_tells():
    files = MANIFEST["fixtures"]
    assert files["dflash"]["files"]["model.safetensors"] == files["dspark-markov-off"]["files"]["model.safetensors"]
    a, b = present("dflash")[0], present("dspark-markov-off")[0]
    assert fingerprint(a.config, a.tensors).family == "speculators_dflash"
    assert fingerprint(b.config, b.tensors).family == "speculators_dspark"


@pytest.mark.parametrize("kind,vllm", [("dspark", "dspark"), ("dflash", "dflash"), ("dflash2", "dflash"),
                                       ("eagle3", "eagle3"), ("peagle", "eagle3"), ("xpress", None), ("mtp", None)])
def test_each_speculators_family_has_the_vllm_method_that_fits(kind, vllm):
    spec = FAMILIES[f"speculators_{kind}"]
    assert spec.methods["vllm"] == vllm
    assert spec.speculators_type == kind and spec.format == "speculators"


def test_crosswalk_maps_context_norms_mlp_and_heads_but_not_attention():
    assert speculators.k3_counterpart("fc.weight") == "context_proj.weight"
    assert speculators.k3_counterpart("layers.3.mlp.down_proj.weight") == "layers.3.mlp.down_proj.weight"
    assert speculators.k3_counterpart("markov_head.markov_w2.weight") == "markov_head.markov_w2.weight"
    for name in ("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.o_proj.weight", "d2t", "lm_head.weight",
                 "markov_head.gate_proj.weight"):
        assert speculators.k3_counterpart(name) is None, name
    assert speculators.speculators_counterpart("final_norm.weight") == "norm.weight"
    assert speculators.speculators_counterpart("layers.0.self_attn.kv_a_proj_with_mqa.weight") is None
    assert speculators.speculators_counterpart("embed_tokens.weight") is None


def test_every_registered_format_answers_the_same_questions():
    from dspark_hub.format.registry import FORMATS
    from dspark_hub.verify.checks import config_findings
    from dspark_hub.verify.family import detect

    configs = {"k3_dspark": contract.TINY_CONFIG, "speculators_dspark": read_config(fixture("dspark"))}
    assert set(FORMATS) == set(configs)
    for name, fmt in FORMATS.items():
        config = configs[name]
        assert detect(config)[0] is fmt
        roster = fmt.roster(config)
        counts = fmt.counts({n: s.shape for n, s in roster.items()})
        assert counts.trained + counts.frozen == counts.total > 0
        assert config_findings(fmt, config) == [] or (name == "k3_dspark" and all(
            f.severity != "error" for f in config_findings(fmt, config)))
        keys = fmt.pairing_keys(config)
        assert keys.taps and all(isinstance(i, int) for i in keys.taps)
        assert fmt.serving(config).method == "dspark"
        assert "vllm" in loaders_for(fmt) and fmt.layer_order(config)[0].startswith("layers.0.")
    assert FORMATS["speculators_dspark"].pairing_keys(configs["speculators_dspark"]).taps == [0, 2, 4]
