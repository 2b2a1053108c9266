"""card.yaml strings render in a sandbox: no Python reachable from a card source, the documented facts still work."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dspark_hub.cli.main import cli

FRONT = {"license": "apache-2.0", "base_model": "org/teacher", "base_model_relation": "finetune",
         "tags": ["dspark"], "pipeline_tag": "text-generation"}

#: Template strings that reach Python from a card source, each trying to create the file `{marker}`.
ATTACKS = {
    "cycler_globals": "{{ cycler.__init__.__globals__.os.system('touch {marker}') }}",
    "mro_subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "attr_filter": "{{ (''|attr('__class__')|attr('__mro__'))[1] }}",
    "attr_filter_on_facts": "{{ facts|attr('__class__')|attr('__init__')|attr('__globals__') }}",
    "lipsum_globals": "{{ lipsum.__globals__['os'].popen('touch {marker}').read() }}",
    "joiner_globals": "{{ joiner.__init__.__globals__.__builtins__.open('{marker}', 'w') }}",
    "template_reference": "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch "
                          "{marker}') }}",
    "namespace_mutation": "{% set ns = namespace(x=1) %}{% set ns.x = 2 %}{{ ns.x }}",
    "config_global": "{{ config.__class__.__init__.__globals__ }}",
    "request_global": "{{ request.application.__globals__.__builtins__.__import__('os').system('touch {marker}') }}",
    "dict_mutation": "{{ config.update({'a': 1}) }}{{ facts.target_layer_ids.append(1) }}",
    "format_string": "{{ '{0.__class__.__init__.__globals__}'.format(facts) }}",
    "string_bomb": "{{ 'x' * 1000000000 }}",
    "power_bomb": "{{ 7 ** 99999999 }}",
    "include": "{% include '/etc/passwd' %}",
}


def _card_source(folder: Path, summary: str, **more: object) -> Path:
    path = folder / "card.yaml"
    path.write_text(yaml.safe_dump({"name": "Tiny-Draft", "front_matter": FRONT, "summary": summary, **more},
                                   sort_keys=False))
    return path


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_card_source_cannot_reach_python(tiny, tmp_path, attack):
    marker = tmp_path / "M"
    meta = _card_source(tmp_path, ATTACKS[attack].replace("{marker}", str(marker)))
    out = tmp_path / "README.md"
    result = CliRunner().invoke(cli, ["card", str(tiny), "--meta", str(meta), "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: card.yaml:summary: "), result.stderr
    assert "Traceback" not in result.output
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize("attack", ["cycler_globals", "attr_filter", "lipsum_globals"])
def test_a_sandbox_violation_names_the_nested_key(tiny, tmp_path, attack):
    meta = _card_source(tmp_path, "fine", training={"setup": [["lr", ATTACKS[attack].replace("{marker}", "M")]]})
    result = CliRunner().invoke(cli, ["card", str(tiny), "--meta", str(meta), "-o", str(tmp_path / "R.md")])
    assert result.exit_code == 2 and "card.yaml:training.setup[0][1]: " in result.stderr


def test_the_documented_facts_still_render(tiny, tmp_path):
    """The passing twin: facts, config, results and the card filters work inside the sandbox."""
    summary = ("{{ facts.num_layers }} layers; taps {{ facts.target_layer_ids | join(', ') }}; "
               "{{ facts.parameters.total | thousands }} parameters; dtype {{ facts.dtype }}; "
               "q_lora_rank {{ config.q_lora_rank }}; block {{ facts.block_size }}; "
               "{% if facts.source == 'checkpoint' %}computed{% else %}listed{% endif %}; "
               "{{ facts.components[0].shape | shape }}; {{ 0.5 | pct }}; {{ 2 | fixed(1) }}; "
               "{{ results.best_step | num }}; {{ 'ab' * 3 }}; {{ 2 ** 10 }}; "
               "{% for i in facts.target_layer_ids %}[{{ loop.index }}]{% endfor %}")
    meta = _card_source(tmp_path, summary)
    out = tmp_path / "README.md"
    result = CliRunner().invoke(cli, ["card", str(tiny), "--meta", str(meta), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    from dspark_hub.cards.render import card_facts
    facts = card_facts(tiny)
    assert (f"{facts.num_layers} layers; taps {', '.join(map(str, facts.target_layer_ids or []))}; "
            f"{facts.parameters.total:,} parameters; dtype {facts.dtype}; "
            f"q_lora_rank {facts.config['q_lora_rank']}; block {facts.block_size}; computed; ") in text
    assert "; 50.0%; 2.0; —; ababab; 1024; [1][2]" in text
