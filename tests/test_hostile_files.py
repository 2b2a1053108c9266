"""Issue 29, items 10 and 13: the other files a command reads, the files it writes, and the names a card prints.

- A golden fixture's metadata and tensors are checked against the checkpoint's config before anything is
  allocated: a block size, batch or stand-in lm_head that would allocate gigabytes, a case list of the wrong
  type, an unknown tensor, ids out of range are one line, exit 2 (or a problem, exit 1), never a traceback.
- An eval JSON given to `card` with a non-number, a negative count, a rate or length out of range is refused.
- A writer that hits the file-size limit (RLIMIT_FSIZE) or a full device names the file it was writing, for
  Python's writes and the native ones (safetensors, torch).
- A file, tensor or dataset name holding a newline, `|`, backticks, HTML or a leading `#` stays inside its
  table cell or code span; `card lint --checkpoint` reads the names back.

Each class has several members and a passing twin.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from dspark_hub.cards.card_text import code_span, code_text, parse_card
from dspark_hub.cli.main import cli
from dspark_hub.format.writer import write_file
from dspark_hub.verify.golden_fixture import MAX_BLOCK_SIZE

from .cli_errors import assert_one_line_error
from .factories import write_checkpoint

ROOT = Path(__file__).resolve().parent.parent
FRONT = {"license": "apache-2.0", "base_model": "org/teacher", "tags": ["dspark"], "pipeline_tag": "text-generation"}


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


# ---------------------------------------------------------------- golden fixtures

@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    folder = tmp_path_factory.mktemp("golden")
    ckpt = write_checkpoint(folder / "ckpt")
    result = run("golden", ckpt, "-o", folder / "golden.safetensors", "--json")
    assert result.exit_code == 0, result.output
    return ckpt, folder / "golden.safetensors"


def edit_metadata(path: Path, edit) -> None:
    """Rewrite a fixture's `__metadata__` in place (tensor bytes untouched)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edit(header["__metadata__"])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def edit_json(key, edit):
    def change(meta):
        value = json.loads(meta[key])
        edit(value)
        meta[key] = json.dumps(value)
    return change


def edit_tensors(path: Path, edit) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        meta = handle.metadata()
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata=meta)


#: name -> (damage the fixture at `path`, words of the one-line error)
FIXTURES = {
    "block size not a number": (lambda p: edit_metadata(p, lambda m: m.update(block_size="seven")), ["block_size"]),
    "block size of 10^8": (lambda p: edit_metadata(p, lambda m: m.update(block_size="100000000")),
                           ["block_size", f"1..{MAX_BLOCK_SIZE}"]),
    "block size 0": (lambda p: edit_metadata(p, lambda m: m.update(block_size="0")), ["block_size"]),
    "cases a list": (lambda p: edit_metadata(p, lambda m: m.update(cases="[1, 2]")), ["'cases' is not a JSON object"]),
    "a batch of 10^8": (lambda p: edit_metadata(p, edit_json("cases", lambda c: c["short"].update(batch=10 ** 8))),
                        ["cases.\"short\""]),
    "a case named ../x": (lambda p: edit_metadata(p, edit_json("cases", lambda c: c.update({"../x": c.pop("short")}))),
                          ["cases.\"../x\""]),
    "no cases": (lambda p: edit_metadata(p, edit_json("cases", lambda c: c.clear())), ["cases is empty"]),
    "a stand-in without a seed": (lambda p: edit_metadata(p, edit_json("lm_head", lambda h: h.pop("seed"))),
                                  ["lm_head.seed"]),
    "a seed of 10^30": (lambda p: edit_metadata(p, edit_json("lm_head", lambda h: h.update(seed=10 ** 30))),
                        ["lm_head.seed"]),
    "an lm_head of another kind": (lambda p: edit_metadata(p, edit_json("lm_head", lambda h: h.update(kind="pickle"))),
                                   ["lm_head.kind"]),
    "a tolerance not an object": (lambda p: edit_metadata(p, edit_json(
        "tolerances", lambda t: t.update(last_hidden_state=5))), ["tolerances.last_hidden_state"]),
    "a negative tolerance": (lambda p: edit_metadata(p, edit_json(
        "tolerances", lambda t: t["markov_bias"].update(atol=-1))), ["tolerances.markov_bias"]),
    "config not an object": (lambda p: edit_metadata(p, lambda m: m.update(config="[]")), ["'config'"]),
    "no config_sha256": (lambda p: edit_metadata(p, lambda m: m.pop("config_sha256")), ["'config_sha256' is missing"]),
    "an extra tensor": (lambda p: edit_tensors(p, lambda t: t.update(extra=torch.zeros(4))), ["'extra'"]),
    "inputs of another shape": (lambda p: edit_tensors(p, lambda t: t.update(
        {"short.context_states": torch.zeros(2, 6, 5)})), ["short.context_states is F32 [2, 6, 5]"]),
    "a token id past the vocabulary": (lambda p: edit_tensors(p, lambda t: t["long.drafted_tokens"].fill_(10 ** 9)),
                                       ["long.drafted_tokens", "outside [0,"]),
    "a negative position": (lambda p: edit_tensors(p, lambda t: t["short.position_ids"].fill_(-5)),
                            ["short.position_ids"]),
    "an input missing": (lambda p: edit_tensors(p, lambda t: t.pop("long.anchor_ids")), ["long.anchor_ids"]),
}


@pytest.mark.parametrize("name", list(FIXTURES))
def test_a_hostile_fixture_is_one_line_before_anything_is_allocated(golden, tmp_path, name):
    ckpt, fixture = golden
    copy = Path(shutil.copy(fixture, tmp_path / "g.safetensors"))
    damage, words = FIXTURES[name]
    damage(copy)
    assert_one_line_error(run("golden", "check", ckpt, copy), "g.safetensors", *words)


@pytest.mark.parametrize("key, value", [("draft_vocab_size", 10 ** 9), ("hidden_size", 10 ** 6)])
def test_a_fixture_written_for_a_huge_head_is_a_problem_not_an_allocation(golden, tmp_path, key, value):
    """The stand-in lm_head is made from the checkpoint's own config; a fixture claiming another size is not
    recomputed (10^9 rows would be gigabytes)."""
    ckpt, fixture = golden
    copy = Path(shutil.copy(fixture, tmp_path / "g.safetensors"))
    edit_metadata(copy, edit_json("config", lambda c: c.update({key: value})))
    result = run("golden", "check", ckpt, copy, "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["comparisons"] == [] and any("nothing was recomputed" in p for p in doc["problems"])


@pytest.mark.parametrize("option", [("--atol", "nan"), ("--rtol", "-1"), ("--atol", "inf")])
def test_a_tolerance_that_is_no_tolerance_is_refused(golden, option):
    ckpt, fixture = golden
    assert_one_line_error(run("golden", "check", ckpt, fixture, *option), option[0], "finite number >= 0")


def test_golden_write_refuses_a_block_that_would_allocate_gigabytes(golden, tmp_path):
    ckpt, _ = golden
    assert_one_line_error(run("golden", ckpt, "-o", tmp_path / "g.safetensors", "--block-size", "100000000"),
                          "--block-size", f"1..{MAX_BLOCK_SIZE}")
    assert not (tmp_path / "g.safetensors").exists()


#: name -> (write a hostile lm_head file at `path`, words of the one-line error)
HEADS = {
    "a FIFO": (lambda p: os.mkfifo(p), ["named pipe (FIFO)"]),
    "integer weights": (lambda p: save_file({"lm_head.weight": torch.zeros(512, 64, dtype=torch.int64)}, str(p)),
                        ["lm_head.weight is [512, 64] I64"]),
    "two tensors, neither lm_head": (lambda p: save_file({"a": torch.zeros(1), "b": torch.zeros(1)}, str(p)),
                                     ["holds 2 tensors and no lm_head.weight"]),
    "a header that lies about its size": (lambda p: p.write_bytes(struct.pack("<Q", 100) + b"{" * 100), []),
}


@pytest.mark.parametrize("name", list(HEADS))
def test_a_hostile_lm_head_file_is_one_line_and_never_blocks(golden, tmp_path, name):
    from .test_folder import Unblocker

    ckpt, _ = golden
    head = tmp_path / "head.safetensors"
    make, words = HEADS[name]
    make(head)
    with Unblocker(head) if name == "a FIFO" else contextlib.nullcontext():
        result = run("golden", ckpt, "-o", tmp_path / "g.safetensors", "--lm-head", head)
    assert_one_line_error(result, "head.safetensors", *words)
    assert not (tmp_path / "g.safetensors").exists()


def test_a_sound_fixture_still_checks(golden):
    """The twin: the fixture as written passes, with the tolerances overridden too."""
    ckpt, fixture = golden
    assert run("golden", "check", ckpt, fixture).exit_code == 0
    assert run("golden", "check", ckpt, fixture, "--atol", "0.001", "--rtol", "0").exit_code == 0


# ---------------------------------------------------------------- eval JSON given to card

@pytest.fixture
def card_source(tmp_path):
    meta = tmp_path / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2}}))
    return meta


#: name -> (the eval document, words of the one-line error)
EVALS = {
    "a length that is text": ({"per_position": [0.5, 0.3], "acceptance_length": "1.8"},
                              ['acceptance_length is "1.8"']),
    "a length that is true": ({"per_position": [0.5], "acceptance_length": True}, ["acceptance_length is true"]),
    "a length below 1": ({"per_position": [0.5], "acceptance_length": 0.4}, ["acceptance_length is 0.4"]),
    "a length past 1 + k": ({"per_position": [0.5], "acceptance_length": 9}, ["acceptance_length is 9"]),
    "a negative rate": ({"per_position": [-0.2]}, ["outside [0, 1]"]),
    "a rate that is text": ({"per_position": ["50%"]}, ["per_position must be a list of numbers"]),
    "negative drafts": ({"per_position": [0.5], "drafts": -5}, ["drafts is -5"]),
    "fractional tokens": ({"per_position": [0.5], "harness": {"tokens": 1.5}}, ["harness.tokens is 1.5"]),
    "prompts that are true": ({"per_position": [0.5], "num_prompts": True}, ["num_prompts is true"]),
    "a block size of 0": ({"per_position": [0.5], "block_size": 0}, ["block_size is 0"]),
    "negative accepted counts": ({"per_position": [0.5], "accepted_per_position": [3, -1]},
                                 ["accepted_per_position is [3, -1]"]),
    "a dataset row that is no number": ({"by_dataset": {"gsm8k": {"per_position": [0.5, None]}}},
                                        ["by_dataset.gsm8k"]),
    "a long-context row that is no object": ({"long_context": {"rows": [5]}}, ["long_context.rows[0]"]),
    "a negative context length": ({"long_context": {"rows": [{"domain": "code", "context_length": -4,
                                                              "per_position": [0.5]}]}}, ["context length is -4"]),
}


@pytest.mark.parametrize("name", list(EVALS))
def test_card_refuses_an_eval_file_with_a_value_no_card_should_print(tiny_ckpt, card_source, tmp_path, name):
    doc, words = EVALS[name]
    (tmp_path / "eval.json").write_text(json.dumps(doc))
    result = run("card", tiny_ckpt, "--meta", card_source, "--eval", tmp_path / "eval.json", "-o", tmp_path / "c.md")
    assert_one_line_error(result, "eval.json", *words)
    assert not (tmp_path / "c.md").exists()


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("card") / "ckpt")


def test_a_sound_eval_file_renders_and_lints(tiny_ckpt, card_source, tmp_path):
    """The twin: rates as fractions and as percentages, whole counts, a length of exactly 1 + the rates."""
    doc = {"by_dataset": {"gsm8k": {"per_position": [80, 50], "acceptance_length": 2.3}, "code": {
        "per_position": [0.5, 0.25]}}, "drafts": 0, "tokens": 120, "num_prompts": 4, "block_size": 2,
        "accepted_per_position": [0, 0], "mode": "simulated", "simulation": "teacher-forced"}
    (tmp_path / "eval.json").write_text(json.dumps(doc))
    out = tmp_path / "c.md"
    result = run("card", tiny_ckpt, "--meta", card_source, "--eval", tmp_path / "eval.json", "-o", out)
    assert result.exit_code == 0, result.output
    assert "| gsm8k | 80.0% | 50.0% | 2.30 |" in out.read_text()
    assert run("card", "lint", out, "--checkpoint", tiny_ckpt).exit_code == 0


# ---------------------------------------------------------------- names in a card

#: name -> a file name the checkpoint folder holds
HOSTILE_NAMES = {
    "a newline and a heading": "a\n# Injected heading\n| b | c |.txt",
    "a carriage return": "a\rb.txt",
    "a line separator": "a\u2028# b.txt",
    "a pipe": "pipe|name.txt",
    "backticks": "tick`s``x.txt",
    "html": "<img src=x onerror=alert(1)>.txt",
    "a leading #": "#not a heading.txt",
    "a leading backtick and space": "` spaced `",
    "a backslash escape": "back\\nslash.txt",
}


@pytest.mark.parametrize("member", list(HOSTILE_NAMES))
def test_a_hostile_file_name_stays_in_its_checksum_cell_and_lints_back(tiny_ckpt, card_source, tmp_path, member):
    folder = Path(shutil.copytree(tiny_ckpt, tmp_path / "ckpt"))
    name = HOSTILE_NAMES[member]
    (folder / name).write_text("x")
    out = tmp_path / "README.md"
    assert run("card", folder, "--meta", card_source, "-o", out).exit_code == 0
    card = parse_card(out.read_text())
    headings = [text for _, text in card.body if text.startswith("#")]
    assert headings == ["# Tiny", "## Architecture", "## Training", "## Results", "## Usage", "## Checksums",
                        "## License"], headings
    (table,) = [t for t in card.tables if t.headers[:1] == ["File"]]
    assert name in [code_text(cells[0]) for _, cells in table.rows]
    assert all(len(cells) == 3 for _, cells in table.rows)
    assert "<img" not in out.read_text().replace("`<img", "")     # HTML only inside a code span
    linted = run("card", "lint", out, "--checkpoint", folder)
    assert linted.exit_code == 0, linted.output


def test_hostile_tensor_dataset_and_case_names_are_escaped(tmp_path, card_source):
    def odd(t):
        t["x\n# Tensor heading|y"] = torch.zeros(2, dtype=torch.bfloat16)
    folder = write_checkpoint(tmp_path / "ckpt", mutate=odd)
    (tmp_path / "eval.json").write_text(json.dumps({"by_dataset": {"d\n## Dataset heading|<b>": {
        "per_position": [0.5]}}, "mode": "simulated", "simulation": "sim\n# label heading"}))
    out = tmp_path / "README.md"
    result = run("card", folder, "--meta", card_source, "--eval", tmp_path / "eval.json", "-o", out)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "\n# Tensor heading" not in text and "\n## Dataset heading" not in text and "\n# label heading" not in text
    assert "`x\\n# Tensor heading\\|y`" in text and "d\\n## Dataset heading\\|\\<b\\>" in text
    assert all(len(cells) == len(t.headers) for t in parse_card(text).tables for _, cells in t.rows)


def test_hostile_golden_cases_and_training_values_are_escaped(golden, tmp_path, card_source):
    ckpt, fixture = golden
    folder = Path(shutil.copytree(ckpt, tmp_path / "ckpt"))
    (folder / "golden").mkdir()
    shutil.copy(fixture, folder / "golden" / "g.safetensors")
    edit_metadata(folder / "golden" / "g.safetensors", lambda m: m.update(
        cases=json.dumps({"x\n# Case heading": {"context_start": "\n# Start heading"}}), block_size="7\n# Block"))
    log = tmp_path / "run" / "training_log.jsonl"
    log.parent.mkdir()
    log.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    (log.parent / "training_args.json").write_text(json.dumps({"dtype": "bf16\n# Args heading|<b>", "steps": 1}))
    out = tmp_path / "README.md"
    result = run("card", folder, "--meta", card_source, "--train-log", log, "-o", out)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert not any(h in text for h in ("\n# Case", "\n# Start", "\n# Block", "\n# Args"))
    assert "x\\n# Case heading from position \\n# Start heading" in text and "bf16\\n# Args heading\\|\\<b\\>" in text


@pytest.mark.parametrize("name", ["config.json", "golden/golden.safetensors", "layers.{0..2}.w", "über-β.txt"])
def test_ordinary_names_print_as_before(name):
    """The twin: a name without anything to escape is a plain code span, read back as itself."""
    assert code_span(name) == f"`{name}`" and code_text(code_span(name, cell=True)) == name


# ---------------------------------------------------------------- writers that hit a limit

def _limited(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def dspark(*args, limit: int, cwd: Path):
    return subprocess.run([sys.executable, "-m", "dspark_hub", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_limited(limit),
                          timeout=600)


#: name -> (the command line, run in `tmp` with a conforming checkpoint `ckpt`; the file the error names; the
#: limit in bytes: past the small files it writes first, short of the one named)
WRITERS = {
    "convert (streamed safetensors)": (lambda ckpt, tmp: ["convert", ckpt, tmp / "out"], "out/model.safetensors",
                                       65536),
    "init (streamed safetensors)": (lambda ckpt, tmp: ["init", tmp / "new"], "new/model.safetensors", 65536),
    "card (a text file)": (lambda ckpt, tmp: ["card", ckpt, "--meta", _source(tmp), "-o", tmp / "README.md"],
                           "README.md", 256),
    "golden (the safetensors library)": (lambda ckpt, tmp: ["golden", ckpt, "-o", tmp / "g.safetensors"],
                                         "g.safetensors", 4096),
    "package (several files)": (lambda ckpt, tmp: ["package", ckpt, "--repo", "org/x", "-o", tmp / "pkg"], "pkg/",
                                256),
}


def _source(tmp: Path) -> Path:
    meta = tmp / "card.yaml"
    meta.write_text(yaml.safe_dump({"name": "Tiny", "front_matter": FRONT, "architecture": {"block_size": 2}}))
    return meta


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WRITERS))
def test_a_writer_at_the_file_size_limit_names_the_file(tiny_ckpt, tmp_path, name):
    args, named, limit = WRITERS[name]
    done = dspark(*args(tiny_ckpt, tmp_path), limit=limit, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("Error: ") and named in line and "File too large" in line, line
    assert not line.startswith("Error: I/O")
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert leftovers == []


@pytest.mark.slow
def test_torch_save_at_the_file_size_limit_names_the_state_file(tmp_path):
    """A training state is written by torch's native zip writer into an atomic file."""
    script = ("import torch, sys\nfrom dspark_hub.format.writer import atomic_file\n"
              "with atomic_file(sys.argv[1]) as handle:\n    torch.save({'w': torch.zeros(10000)}, handle)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "step-000001.pt")], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_limited(4096))
    assert "OSError: [Errno 27] File too large: " in done.stderr and "step-000001.pt" in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())


def test_a_full_device_names_the_file():
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with pytest.raises(OSError) as caught:
        write_file("/dev/full", b"x" * 100)
    assert (caught.value.errno, caught.value.filename) == (errno.ENOSPC, "/dev/full")


def test_a_writer_under_the_limit_writes(tiny_ckpt, tmp_path):
    """The twin: the same command with room to write succeeds and leaves no temporary file."""
    done = dspark("convert", tiny_ckpt, tmp_path / "out", limit=1 << 30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "model.safetensors").is_file() and not [
        p for p in tmp_path.iterdir() if ".tmp-" in p.name]
