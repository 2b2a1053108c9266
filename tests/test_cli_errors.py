"""The CLI's error boundary: one formatter per error type, flags from the running command, and `--json` errors.

The formatters are unit-tested directly against a small click command (style.md: "Unit-test each
formatter directly"); the boundary is then tested through `CliRunner`.
"""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from dspark_hub.cli._errors import ErrorReport, format_error, in_cli_terms
from dspark_hub.cli.main import cli
from dspark_hub.errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    ContractError,
    DsparkError,
    HubError,
    MissingDependencyError,
    RefusedOverwriteError,
    UsageError,
)

from .cli_errors import assert_one_line_error
from .factories import write_checkpoint

COMMAND = click.Command("probe", params=[
    click.Argument(["path"]),
    click.Option(["--drop-in", "drop_in"]),
    click.Option(["-o", "--output", "output"]),
    click.Option(["--teacher"]),
    click.Option(["--force"], is_flag=True),
])
BARE = click.Command("bare", params=[click.Argument(["path"])])


def run(*args, **kwargs):
    return CliRunner(**kwargs).invoke(cli, [str(a) for a in args], prog_name="dspark-hub")


# ----------------------------------------------------------------------------- formatters, one per type

def test_usage_error_param_becomes_the_commands_flag():
    error = UsageError("'kimi-k4' is neither a bundled reference (kimi-k3) nor a checkpoint folder", param="drop_in")
    assert str(error) == "drop_in: 'kimi-k4' is neither a bundled reference (kimi-k3) nor a checkpoint folder"
    assert format_error(error, COMMAND) == ErrorReport(
        "USAGE", "--drop-in: 'kimi-k4' is neither a bundled reference (kimi-k3) nor a checkpoint folder", None, 2)


def test_param_spelled_by_the_longest_option_name_or_the_arguments_metavar():
    assert format_error(UsageError("bad", param="output"), COMMAND).message == "--output: bad"
    assert format_error(UsageError("bad", param="path"), COMMAND).message == "PATH: bad"
    assert format_error(UsageError("bad", param="drop_in"), BARE).message == "drop_in: bad"   # not a flag here


def test_backticked_arguments_become_flags_only_when_the_command_has_them():
    error = UsageError("no teacher; pass `teacher` (or `data`)", hint="see `force`")
    report = format_error(error, COMMAND)
    assert (report.message, report.hint) == ("no teacher; pass --teacher (or `data`)", "see --force")
    assert in_cli_terms("pass `teacher`", BARE) == "pass `teacher`"


def test_refused_overwrite_gets_the_force_hint_from_the_command():
    error = RefusedOverwriteError("out/")
    assert str(error) == "out/: already exists" and error.path == "out/"
    report = format_error(error, COMMAND)
    assert report == ErrorReport("REFUSED_OVERWRITE", "out/: already exists", "pass --force to replace it", 2)
    assert report.line() == "out/: already exists; pass --force to replace it"
    assert format_error(error, BARE).hint is None   # a command without --force cannot offer it


def test_refused_overwrite_says_why_when_it_matters():
    error = RefusedOverwriteError("data", "cannot resume: setting max_new_tokens was 8 and is now 9")
    assert format_error(error, COMMAND).line() == ("data: cannot resume: setting max_new_tokens was 8 and is now 9; "
                                                   "pass --force to replace it")


@pytest.mark.parametrize("error, code, message", [
    (CheckpointNotFoundError("ckpt: no such file or directory; pass a checkpoint folder"), "NOT_FOUND",
     "ckpt: no such file or directory; pass a checkpoint folder"),
    (MissingDependencyError("needs matplotlib; pip install matplotlib", param="teacher"), "MISSING_DEPENDENCY",
     "--teacher: needs matplotlib; pip install matplotlib"),
    (HubError("hf://o/n: repository not found"), "HUB", "hf://o/n: repository not found"),
    (ContractError("config.json: 'num_hidden_layers' must be a positive integer", key="num_hidden_layers"),
     "CONTRACT", "config.json: 'num_hidden_layers' must be a positive integer"),
    (CheckpointFormatError("HEADER_TOO_LARGE", "header length 9 exceeds 8 bytes", path="m.safetensors"),
     "CHECKPOINT_FORMAT", "m.safetensors: header length 9 exceeds 8 bytes"),
    (DsparkError("something; do this"), "ERROR", "something; do this"),
])
def test_each_library_error_type_has_a_stable_code(error, code, message):
    assert format_error(error, COMMAND) == ErrorReport(code, message, None, 2)


def test_os_error_names_the_file():
    assert format_error(OSError(28, "No space left on device", "out/model.safetensors"), COMMAND) == ErrorReport(
        "IO", "out/model.safetensors: No space left on device")
    assert format_error(OSError(5, "Input/output error"), COMMAND).message == "I/O: Input/output error"


def test_click_usage_error_keeps_clicks_message_and_points_at_help():
    ctx = click.Context(COMMAND, info_name="probe")
    report = format_error(click.BadParameter("'x' is not a number", ctx=ctx, param_hint="'--seed'"), COMMAND)
    assert report == ErrorReport("USAGE", "Invalid value for '--seed': 'x' is not a number",
                                 "try 'probe --help' for help", 2)


def test_unknown_errors_are_bugs_not_formatted():
    with pytest.raises(TypeError):
        format_error(ValueError("bug"), COMMAND)


def test_error_document_shape():
    assert ErrorReport("USAGE", "--drop-in: bad", "h").to_dict() == {
        "schema": "dspark-hub/error/1", "ok": False,
        "error": {"code": "USAGE", "message": "--drop-in: bad", "hint": "h"}}


# ----------------------------------------------------------------------------- the boundary, end to end

def test_refused_overwrite_on_the_command_line(tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    result = run("init", out)
    assert assert_one_line_error(result) == f"Error: {out}: already exists; pass --force to replace it"
    assert result.stdout == ""


def test_library_usage_error_names_the_flag(tmp_path):
    line = assert_one_line_error(run("verify", write_checkpoint(tmp_path / "c"), "--drop-in", "kimi-k4"))
    assert line.startswith("Error: --drop-in: 'kimi-k4' is neither a bundled reference")


@pytest.mark.parametrize("command, option", [
    (["verify", "{ckpt}", "--target"], "--target"),
    (["verify", "{ckpt}", "--frozen-embed"], "--frozen-embed"),
    (["init", "{out}", "--embed-from"], "--embed-from"),
])
def test_a_missing_path_names_the_option_that_gave_it(tmp_path, command, option):
    ckpt = write_checkpoint(tmp_path / "c")
    args = [a.format(ckpt=ckpt, out=tmp_path / "new") for a in command] + [str(tmp_path / "nope")]
    line = assert_one_line_error(run(*args))
    assert line.startswith(f"Error: {option}: {tmp_path / 'nope'}: no such file or directory"), line
    assert not (tmp_path / "new").exists()


def test_json_usage_error_is_one_document_on_stdout(tmp_path):
    result = run("verify", write_checkpoint(tmp_path / "c"), "--drop-in", "kimi-k4", "--json")
    line = assert_one_line_error(result)
    doc = json.loads(result.stdout)
    assert doc == {"schema": "dspark-hub/error/1", "ok": False,
                   "error": {"code": "USAGE", "message": line.removeprefix("Error: "), "hint": None}}


def test_json_refused_overwrite_carries_the_hint(tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    result = run("init", out, "--json")
    assert_one_line_error(result)
    assert json.loads(result.stdout)["error"] == {"code": "REFUSED_OVERWRITE", "message": f"{out}: already exists",
                                                  "hint": "pass --force to replace it"}


def test_json_io_error(tmp_path, monkeypatch):
    from dspark_hub.ops import init

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "c" / "model.safetensors"))
    monkeypatch.setattr(init, "write_safetensors", full)
    result = run("init", tmp_path / "c", "--json")
    assert_one_line_error(result, "No space left on device")
    assert json.loads(result.stdout)["error"]["code"] == "IO"


@pytest.mark.parametrize("args, words", [
    (["verify", ".", "--runtime", "trt", "--json"], ("'trt' is not one of",)),         # a bad option value
    (["rollouts", "--json"], ("Missing option",)),                                       # a missing option
    (["verify", "--bogus", "--json"], ("No such option", "--bogus")),                    # an unknown option
    (["verfy", ".", "--json"], ("No such command", "verfy")),                            # an unknown command
    (["golden", "write", "--json"], ("Missing argument",)),                              # in a subgroup
])
def test_json_clicks_own_usage_errors_too(args, words):
    result = run(*args)
    assert_one_line_error(result, *words, one_line=False)   # click's usage text stays on stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "dspark-hub/error/1" and doc["ok"] is False and doc["error"]["code"] == "USAGE"
    assert all(w in doc["error"]["message"] for w in words)
    assert doc["error"]["hint"].startswith("try 'dspark-hub ")


def test_without_json_errors_leave_stdout_empty(tmp_path):
    assert run("verify", ".", "--runtime", "trt").stdout == ""
    assert run("verify", tmp_path / "nope").stdout == ""
