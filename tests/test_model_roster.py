"""The model's state dict and the contract's roster are one function of the config."""

from __future__ import annotations

import itertools

import pytest
import torch

from dspark_hub.format import contract, roster_k3_dspark
from dspark_hub.modeling import K3DSparkConfig, K3DSparkModel, load_checkpoint
from dspark_hub.verify.checks import verify
from tests.modeling_factory import tiny_config, write_tiny_checkpoint

pytestmark = pytest.mark.torch

ABSENT = object()
#: Every way a head flag can appear in config.json: true, false, null, or not at all.
FLAG_VALUES = [True, False, None, ABSENT]


def config_with(**values: object) -> dict[str, object]:
    config = tiny_config()
    for key, value in values.items():
        if value is ABSENT:
            del config[key]
        else:
            config[key] = value
    return config


def model_shapes(config: dict[str, object]) -> dict[str, tuple[int, ...]]:
    torch.manual_seed(0)
    model = K3DSparkModel(K3DSparkConfig.from_dict(dict(config)))
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def flag_id(value: object) -> str | None:
    return "absent" if value is ABSENT else None


@pytest.mark.parametrize(("enable", "with_markov", "markov_rank", "draft_vocab_size"), list(itertools.product(
    FLAG_VALUES, FLAG_VALUES, [16, 24], [512, 384])), ids=flag_id)
def test_model_state_dict_equals_the_contract_roster(enable, with_markov, markov_rank, draft_vocab_size):
    config = config_with(enable_confidence_head=enable, confidence_head_with_markov=with_markov,
                         markov_rank=markov_rank, draft_vocab_size=draft_vocab_size)
    roster = {name: spec.shape for name, spec in contract.roster(config).items()}
    assert model_shapes(config) == roster


@pytest.mark.parametrize(("enable", "with_markov", "width"), [
    (True, True, 64 + 16), (True, False, 64), (ABSENT, ABSENT, 64 + 16), (True, None, 64),
    (False, True, None), (None, True, None),
], ids=flag_id)
def test_head_flags_mean_the_same_to_roster_and_model(enable, with_markov, width):
    """Absent means the reference's true (`HEAD_FLAG_DEFAULT`), as `K3DSparkConfig` defaults; null means no."""
    config = config_with(enable_confidence_head=enable, confidence_head_with_markov=with_markov)
    roster = contract.roster(config)
    head = {name: spec.shape for name, spec in roster.items() if name.startswith("confidence_head.")}
    assert head == ({"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)} if width else {})
    model = K3DSparkModel(K3DSparkConfig.from_dict(dict(config)))
    assert (model.confidence_head is None) is (width is None)


def test_absent_flags_default_to_the_config_class_default():
    assert roster_k3_dspark.HEAD_FLAG_DEFAULT is K3DSparkConfig().enable_confidence_head is True
    assert K3DSparkConfig().confidence_head_with_markov is roster_k3_dspark.HEAD_FLAG_DEFAULT


def test_a_draft_without_confidence_head_verifies_loads_and_drafts(tmp_path):
    config = tiny_config(enable_confidence_head=False)
    folder = write_tiny_checkpoint(tmp_path / "ckpt", config=config)
    assert verify(folder).ok
    loaded = load_checkpoint(folder)
    assert loaded.ok and loaded.model.confidence_head is None
    model = loaded.model.float()
    proposal = model.propose_block(torch.randn(1, 4, 192), torch.tensor([5]), torch.randn(512, 64), block_size=3)
    assert proposal.tokens.shape == (1, 3) and proposal.confidence is None
    with pytest.raises(ValueError, match="no confidence head"):
        model.confidence_logits(proposal.last_hidden_state, proposal.tokens)


def test_the_model_refuses_to_build_modules_the_roster_lacks(monkeypatch):
    from dspark_hub.modeling import modeling_k3_dspark

    def without_heads(config):
        shapes = roster_k3_dspark.tensor_shapes(config)
        return {name: shape for name, shape in shapes.items() if not name.startswith("markov_head.")}

    monkeypatch.setattr(modeling_k3_dspark, "tensor_shapes", without_heads)
    with pytest.raises(ValueError, match=r"markov_head\.markov_w1\.weight"):
        K3DSparkModel(K3DSparkConfig.from_dict(dict(contract.TINY_CONFIG)))
