"""Model cards: golden regeneration, facts computed from headers, inputs, checksums, the CLI."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dspark_hub.cards.lint import expand_names, parse_card, statements
from dspark_hub.cards.render import card_facts, render_card
from dspark_hub.cli.main import cli
from dspark_hub.errors import UsageError
from dspark_hub.format import contract
from dspark_hub.format.checkpoint import LocalSource, open_checkpoint
from dspark_hub.ops.init import init_checkpoint
from tests.card_fixtures import SDDD, SEED_CARD, SPECULATOR, render_sddd, render_speculator, write_sparse_reference
from tests.cli_errors import assert_one_line_error


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    return write_sparse_reference(tmp_path_factory.mktemp("ref") / "ref")


def _meta(folder: Path, **sections) -> Path:
    doc = {"name": "Tiny-Draft", "front_matter": {"license": "apache-2.0", "base_model": "org/teacher",
                                                  "base_model_relation": "finetune", "tags": ["dspark"],
                                                  "pipeline_tag": "text-generation"}, **sections}
    path = folder / "card.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# ------------------------------------------------------------------ golden cards

def test_sddd_card_regenerates_byte_identically(reference):
    assert render_sddd(reference).encode() == (SDDD / "README.md").read_bytes()


def test_speculator_card_regenerates_byte_identically():
    assert render_speculator().encode() == (SPECULATOR / "README.md").read_bytes()


def test_reference_checkpoint_is_header_only(reference):
    weights = reference / contract.WEIGHTS_NAME
    assert weights.stat().st_size == contract.REFERENCE_ARTIFACT.file_size
    assert weights.stat().st_blocks * 512 < 1 << 20       # a hole, not 7 GB of zeros


def test_card_facts_read_headers_only(reference):
    read = []

    class Counting(LocalSource):
        def read_bytes(self, name, start, length):
            data = super().read_bytes(name, start, length)
            read.append(len(data))
            return data

    facts = card_facts(open_checkpoint(Counting(reference)), hash_files=False)
    assert facts.tensor_count == contract.REFERENCE_ARTIFACT.tensor_count
    assert sum(read) < 64 * 1024
    doc = json.loads(json.dumps(facts.to_dict()))
    assert doc["parameters"] == contract.parameter_counts(contract.REFERENCE_CONFIG).to_dict()
    assert [c["sha256"] for c in doc["checksums"]] == [None, None]


def _seed_front_matter_and_body() -> tuple[dict, str]:
    text = SEED_CARD.read_text()
    text = text[text.index("---"):]              # the seed file starts with its own file name
    _, front, body = text.split("---", 2)
    return yaml.safe_load(front), body


def test_sddd_facts_match_the_seed_card(reference):
    _, body = _seed_front_matter_and_body()
    total, dtype, tensors = re.search(r"([\d,]+) parameters in (\w+) across (\d+) tensors", body).groups()
    trained = re.search(r"only ([\d,]+)\s+parameters", body).group(1)
    facts = card_facts(reference, block_size=7, hash_files=False)
    assert facts.parameters.total == int(total.replace(",", ""))
    assert facts.parameters.trained == int(trained.replace(",", ""))
    assert facts.tensor_count == int(tensors)
    assert facts.dtype == dtype
    shapes = {name: info.shape for name, (_, info) in open_checkpoint(LocalSource(reference)).tensors.items()}
    seed_rows = re.findall(r"^\| `([^`]+)` \| (\d+) x (\d+) \|", body, re.MULTILINE)
    assert len(seed_rows) == 4
    for name, rows, cols in seed_rows:
        for full in expand_names(name):
            full = full if full in shapes else full + ".weight"
            assert shapes[full] == (int(rows), int(cols)), full
    layers = re.search(r"\| (\d+) x decoder layer \| — \| MLA, `q_lora_rank=(\d+)`, `kv_lora_rank=(\d+)`", body)
    assert (facts.num_layers, facts.config["q_lora_rank"], facts.config["kv_lora_rank"]) == tuple(
        int(g) for g in layers.groups())
    ids = re.search(r"teacher layers `(\[[\d, ]+\])`\s+\((\d+) layers total\)", body)
    assert facts.target_layer_ids == json.loads(ids.group(1))
    assert facts.target_num_hidden_layers == int(ids.group(2))
    assert facts.block_size == int(re.search(r"block_size=(\d+)", body).group(1))


def test_sddd_card_keeps_every_section_and_fact_of_the_seed():
    seed_front, seed_body = _seed_front_matter_and_body()
    ours = (SDDD / "README.md").read_text()
    ours_card = parse_card(ours)
    assert yaml.safe_load("\n".join(t for _, t in ours_card.front_matter)) == seed_front
    ours_sections = re.findall(r"^## (.+)$", ours, re.MULTILINE)
    seed_sections = re.findall(r"^## (.+)$", seed_body, re.MULTILINE)
    assert len(seed_sections) >= 5 and set(seed_sections) <= set(ours_sections)
    said = {(s.kind, json.dumps(s.value)) for s in statements(ours_card)}
    seed_statements = statements(parse_card(seed_body))
    assert seed_statements and [s for s in seed_statements if (s.kind, json.dumps(s.value)) not in said] == []
    ours_rows = {tuple(c.replace("**", "") for c in cells) for t in ours_card.tables for _, cells in t.rows}
    # training setup and results: row for row
    seed_rows = [tuple(c.replace("**", "") for c in cells) for table in parse_card(seed_body).tables
                 if table.headers[0] in ("", "Step") for _, cells in table.rows]
    assert len(seed_rows) >= 5 and [row for row in seed_rows if row not in ours_rows] == []
    for phrase in ("Inferact/Kimi-K3-DSpark", "LumenRL", "rounds of 50 batches", "+0.005 per 100 steps",
                   "around 0.10", "Inherits the license of the Kimi-K3 base model"):
        assert phrase in ours


def test_speculator_tables_hold_every_row_of_the_mirror_page():
    page = Path("/work/shared/seeds/kimi-k3-speculator-dspark-mirror-page.txt").read_text()
    rows = re.findall(r"^(.+?) ((?:\d+\.\d% ){8})(\d\.\d\d)$", page, re.MULTILINE)
    ours = (SPECULATOR / "README.md").read_text()
    for key, rates, length in rows:
        key = re.sub(r" (\d{1,3}(?:,\d{3})+)$", r" | \1", key)
        assert f"| {key} | {' | '.join(rates.split())} | {length} |" in ours
    assert len(rows) == 9 + 101
    assert "weights were not at hand" in ours


# ------------------------------------------------------------------ inputs

def test_eval_json_as_eval_prints_it(tmp_path, tiny):
    doc = {"acceptance_length": 1.75, "per_position": [0.5, 0.25], "definition": "AL = 1 + sum of rates",
           "by_dataset": [{"dataset": "code", "per_position": [0.6, 0.3]},
                          {"dataset": "chat", "per_position": [0.4, 0.2], "acceptance_length": 1.6}],
           "prompts": 12, "tokens": 3456, "baseline": {"per_position": [0.1, 0.05], "acceptance_length": 1.15},
           "harness": {"teacher_forced": True, "temperature": 0.0, "block_size": 2,
                       "teacher": {"repo": "org/teacher", "revision": "abc123"},
                       "prompts_sha256": "f" * 64, "chat_template_sha256": "e" * 64},
           "unknown_future_key": {"ignored": True}}
    (tmp_path / "eval.json").write_text(json.dumps(doc))
    text = render_card(_meta(tmp_path), tiny, tmp_path / "eval.json")
    assert "| code | 60.0% | 30.0% | 1.90 |" in text                     # computed 1 + sum
    assert "| chat | 40.0% | 20.0% | 1.60 |" in text
    assert "| all prompts | 50.0% | 25.0% | 1.75 |" in text
    assert "| prompt-lookup baseline | 10.0% | 5.0% | 1.15 |" in text
    harness = next(line for line in text.splitlines() if line.startswith("Harness:"))
    for part in ("definition: AL = 1 + sum of rates", "measurement: teacher-forced", "decoding: greedy",
                 "block size: 2", "teacher: org/teacher@abc123", "prompts: 12", "tokens: 3,456",
                 f"prompt fingerprint: {'f' * 64}", f"chat template digest: {'e' * 64}"):
        assert part in harness


def test_train_log_rows_by_step_with_the_best_in_bold(tmp_path, tiny):
    lines = [{"step": 10, "loss": 3.0, "lr": 1e-4},
             {"step": 20, "loss": 2.5, "eval": {"acceptance_length": 1.5, "loss": 2.75}},
             {"step": 30, "eval_acceptance_length": 1.25},
             {"step": 20, "eval": {"acceptance_length": 1.625, "loss": 2.5}}]          # resumed: replaces step 20
    (tmp_path / "log.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n\n")
    text = render_card(_meta(tmp_path), tiny, train_log=tmp_path / "log.jsonl")
    table = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    assert table == ["| 20 | **1.625** | 2.5 |", "| 30 | 1.25 | — |"]


def test_bad_train_log_line_names_the_line(tmp_path, tiny):
    (tmp_path / "log.jsonl").write_text('{"step": 1}\n{oops\n')
    with pytest.raises(UsageError, match=r"log.jsonl:2: not valid JSON"):
        render_card(_meta(tmp_path), tiny, train_log=tmp_path / "log.jsonl")


def test_invalid_front_matter_is_refused(tmp_path, tiny):
    meta = _meta(tmp_path)
    doc = yaml.safe_load(meta.read_text())
    doc["front_matter"]["license"] = "apache2"
    meta.write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError, match="license 'apache2' is not a Hub license id"):
        render_card(meta, tiny)


def test_without_checkpoint_facts_come_from_metadata_config(tmp_path):
    text = render_card(_meta(tmp_path, architecture={"config": "kimi-k3", "block_size": 7}))
    assert "weights were not at hand" in text and "derived from its config" in text
    assert f"{contract.REFERENCE_ARTIFACT.total_parameters:,} parameters" in text
    assert "No checksums are recorded" in text


def test_prose_naming_an_unknown_fact_fails_clearly(tmp_path):
    meta = _meta(tmp_path, usage="layers {{ facts.nope }}")
    with pytest.raises(UsageError, match=r"card.yaml:usage: .*nope"):
        render_card(meta)


# ------------------------------------------------------------------ checksums and block size

def _checksum_rows(text: str) -> dict[str, tuple[str, str]]:
    return {m[0]: (m[1], m[2]) for m in re.findall(r"^\| `([^`]+)` \| ([\d,]+) \| `?([0-9a-f]{64}|—)`? \|$",
                                                   text, re.MULTILINE)}


def test_checksums_are_computed_streamed(tmp_path, tiny):
    rows = _checksum_rows(render_card(_meta(tmp_path), tiny))
    for name in ("config.json", "model.safetensors"):
        data = (tiny / name).read_bytes()
        assert rows[name] == (f"{len(data):,}", hashlib.sha256(data).hexdigest())


def test_manifest_digests_are_used_instead_of_hashing(tmp_path, tiny):
    size = (tiny / "model.safetensors").stat().st_size
    manifest = tmp_path / "sums.json"
    manifest.write_text(json.dumps({"files": [{"path": "model.safetensors", "size": size, "sha256": "ab" * 32}]}))
    rows = _checksum_rows(render_card(_meta(tmp_path), tiny, checksums_from=manifest, hash_files=False))
    assert rows["model.safetensors"][1] == "ab" * 32
    assert rows["config.json"][1] == "—"
    sums = tmp_path / "SHA256SUMS"
    sums.write_text(f"{'cd' * 32}  config.json\n")
    rows = _checksum_rows(render_card(_meta(tmp_path), tiny, checksums_from=sums))
    assert rows["config.json"][1] == "cd" * 32


def test_manifest_of_other_files_is_refused(tmp_path, tiny):
    manifest = tmp_path / "sums.json"
    manifest.write_text(json.dumps({"files": [{"path": "model.safetensors", "size": 1, "sha256": "ab" * 32}]}))
    with pytest.raises(UsageError, match="manifest says 1 bytes"):
        render_card(_meta(tmp_path), tiny, checksums_from=manifest)


def _with_block_size_metadata(folder: Path, value: str) -> None:
    weights = folder / contract.WEIGHTS_NAME
    raw = weights.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header["__metadata__"]["block_size"] = value
    new = json.dumps(header, separators=(",", ":")).encode()
    new += b" " * (-len(new) % 8)
    weights.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def test_block_size_from_weights_metadata_wins_and_conflicts_fail(tmp_path):
    ckpt = init_checkpoint(tmp_path / "c", profile="tiny").path
    _with_block_size_metadata(ckpt, "4")
    assert card_facts(ckpt, hash_files=False).block_size == 4
    with pytest.raises(UsageError, match="block_size 7 disagrees"):
        card_facts(ckpt, block_size=7, hash_files=False)


# ------------------------------------------------------------------ CLI

def test_cli_card_renders_refuses_overwrite_and_forces(tmp_path, tiny):
    meta, out = _meta(tmp_path), tmp_path / "README.md"
    runner = CliRunner()
    first = runner.invoke(cli, ["card", str(tiny), "--meta", str(meta), "-o", str(out), "--json"])
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert doc["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert out.read_text() == render_card(meta, tiny)
    again = runner.invoke(cli, ["card", str(tiny), "--meta", str(meta), "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.stderr
    forced = runner.invoke(cli, ["card", "render", str(tiny), "--meta", str(meta), "-o", str(out), "--force"])
    assert forced.exit_code == 0
    missing = runner.invoke(cli, ["card", str(tmp_path / "nope"), "--meta", str(meta), "-o", str(tmp_path / "x.md")])
    assert missing.exit_code == 2 and not (tmp_path / "x.md").exists()


def test_cli_card_without_checkpoint(tmp_path):
    out = tmp_path / "README.md"
    result = CliRunner().invoke(cli, ["card", "--meta", str(SPECULATOR / "card.yaml"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == (SPECULATOR / "README.md").read_bytes()


@pytest.mark.parametrize("content, words", [
    ("[" * 100_000 + "]" * 100_000, ("deep.json", "nested too deeply")),
    (b"\xff\xfe junk", ("deep.json", "UTF-8")),
])
def test_cli_card_unreadable_checksums_from_is_one_line(tmp_path, tiny, content, words):
    manifest = tmp_path / "deep.json"
    manifest.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = CliRunner().invoke(cli, ["card", str(tiny), "--meta", str(_meta(tmp_path)), "--checksums-from",
                                      str(manifest), "-o", str(tmp_path / "README.md")])
    assert_one_line_error(result, *words)


# ------------------------------------------------------------------ facts print as text (issue 24, 3)

@pytest.mark.parametrize(("expression", "expected"), [
    ("{{ facts.parameters }}", lambda f: f"{f.parameters.total:,}"),                  # the total, with separators
    ("{{ facts.parameters.trained | thousands }}", lambda f: f"{f.parameters.trained:,}"),
    ("{{ facts.components }}", lambda f: ", ".join(c.name for c in f.components)),   # the components' names
    ("{{ facts.checksums }}", lambda f: ", ".join(c.file for c in f.checksums)),
    ("{{ facts.target_layer_ids }}", lambda f: str(f.target_layer_ids)),              # [1, 3, ...] as the card shows
    ("{{ facts.dtype }}", lambda f: f.dtype),
])
def test_a_fact_in_prose_prints_as_a_reader_expects(tmp_path, tiny, expression, expected):
    facts = card_facts(tiny)
    text = render_card(_meta(tmp_path, usage=f"FACT<{expression}>"), tiny)
    printed = re.search(r"FACT<(.*?)>", text).group(1)
    assert printed == expected(facts)
    assert "(" not in printed and "=" not in printed and "0x" not in printed


@pytest.mark.parametrize(("expression", "named"), [
    ("{{ facts.config }}", "`.model_type`"),                 # a mapping: name one of its keys
    ("{{ facts.golden + [{'case': 1}] }}", "`.case`"),      # a list of mappings
    ("{{ facts }}", "`.parameters`"),                        # the facts object itself
])
def test_a_fact_with_no_reader_text_is_refused_naming_what_to_print(tmp_path, tiny, expression, named):
    with pytest.raises(UsageError, match=r"card.yaml:usage: it prints a \w+ as Python text") as err:
        render_card(_meta(tmp_path, usage=expression), tiny)
    assert named in str(err.value)
