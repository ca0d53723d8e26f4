"""Run config files: malformed ones are refused with the field and the file named; the CLI
writes configs that load back unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from karotte.cli import _register, app
from karotte.config import EvaluationRunConfig
from karotte.errors import ConfigError


def write(tmp_path: Path, data: Any, name: str = "run_config.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        EvaluationRunConfig.load(path)
    return str(caught.value)


def test_a_valid_config_loads(tmp_path: Path) -> None:
    path = write(tmp_path, {"task_id": "hello", "model": "openai/gpt-5", "max_turns": 7})
    config = EvaluationRunConfig.load(path)
    assert (config.task_id, config.model, config.max_turns) == ("hello", "openai/gpt-5", 7)


def test_unknown_field(tmp_path: Path) -> None:
    path = write(tmp_path, {"task_id": "t", "max_turn": 5})
    message = load_error(path)
    assert str(path) in message
    assert "field 'max_turn'" in message
    assert "unknown field" in message


def test_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, {"task_id": "t", "max_turns": "many"})
    message = load_error(path)
    assert str(path) in message
    assert "field 'max_turns'" in message
    assert "integer" in message


def test_wrong_type_in_a_string_field(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, {"task_id": "t", "model": ["openai/gpt-5"]}))
    assert "field 'model'" in message


def test_missing_task_id(tmp_path: Path) -> None:
    path = write(tmp_path, {"model": "openai/gpt-5"})
    message = load_error(path)
    assert str(path) in message
    assert "field 'task_id'" in message
    assert "required field is missing" in message


def test_empty_task_id(tmp_path: Path) -> None:
    assert "field 'task_id'" in load_error(write(tmp_path, {"task_id": ""}))


def test_bad_json_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "task_id": "t",\n  "max_turns": 5,,\n}\n')
    message = load_error(path)
    assert str(path) in message
    assert "not valid JSON" in message
    assert "line 3, column 18" in message  # the second comma


@pytest.mark.parametrize("content", ["[]", '"task"', "42", "null"])
def test_non_object_json(tmp_path: Path, content: str) -> None:
    path = write(tmp_path, content)
    message = load_error(path)
    assert str(path) in message
    assert "must be a JSON object" in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    message = load_error(path)
    assert str(path) in message and "cannot read" in message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_turns", -1),
        ("max_turns", 0),
        ("step_time_limit_s", -5),
        ("task_time_limit_s", 0),
        ("judge_timeout_s", -1),
        ("tool_timeout_s", 0),
        ("max_output_tokens", -100),
        ("max_context_tokens", 0),
        ("max_empty_turns", -1),
        ("model_retry_budget_s", -0.5),
        ("tool_output_limit_chars", 10),
        ("pass_threshold", 1.5),
    ],
)
def test_out_of_range_limits(tmp_path: Path, field: str, value: float) -> None:
    path = write(tmp_path, {"task_id": "t", field: value})
    message = load_error(path)
    assert str(path) in message
    assert f"field '{field}'" in message


@pytest.mark.parametrize("transcript", ["out/transcript.txt", "out/transcript", "out/t.json.gz"])
def test_transcript_must_be_json(tmp_path: Path, transcript: str) -> None:
    message = load_error(write(tmp_path, {"task_id": "t", "transcript_file": transcript}))
    assert "field 'transcript_file'" in message
    assert ".json" in message


@pytest.mark.parametrize("run_id", ["../../etc", "a/b", ".hidden", "", "x" * 200])
def test_run_id_cannot_escape_the_output_directory(tmp_path: Path, run_id: str) -> None:
    assert "field 'run_id'" in load_error(write(tmp_path, {"task_id": "t", "run_id": run_id}))


def test_bad_enum_values(tmp_path: Path) -> None:
    path = write(
        tmp_path, {"task_id": "t", "reasoning_effort": "extreme", "student_network": "any"}
    )
    message = load_error(path)
    assert "field 'reasoning_effort'" in message
    assert "field 'student_network'" in message
    assert len(message.splitlines()) == 2  # one line per problem


def test_unset_api_key_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAROTTE_TEST_UNSET_KEY", raising=False)
    path = write(tmp_path, {"task_id": "t", "model_api_key": "$KAROTTE_TEST_UNSET_KEY"})
    config = EvaluationRunConfig.load(path)  # resolved when the run starts, not when loaded
    with pytest.raises(ConfigError) as caught:
        config.resolved_api_key()
    assert "model_api_key" in str(caught.value)
    assert "$KAROTTE_TEST_UNSET_KEY" in str(caught.value)
    monkeypatch.setenv("KAROTTE_TEST_UNSET_KEY", "sk-now-set")
    assert config.resolved_api_key() == "sk-now-set"
    monkeypatch.setenv("KAROTTE_TEST_BRACED", "sk-braced")
    assert (
        config.model_copy(update={"model_api_key": "${KAROTTE_TEST_BRACED}"}).resolved_api_key()
        == "sk-braced"
    )


def test_literal_keys_are_redacted_and_references_kept() -> None:
    literal = EvaluationRunConfig(task_id="t", model_api_key="sk-secret")
    assert literal.redacted()["model_api_key"] == "***"
    assert "sk-secret" not in json.dumps(literal.redacted())
    reference = EvaluationRunConfig(task_id="t", model_api_key="$OPENAI_API_KEY")
    assert reference.redacted()["model_api_key"] == "$OPENAI_API_KEY"


# ---- through the CLI -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register()
    return CliRunner()


def test_create_run_config_round_trip(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "rc.json"
    result = runner.invoke(
        app,
        [
            "create-run-config",
            "-o",
            str(out),
            "--task",
            "hello-world",
            "--model",
            "anthropic/claude-opus-4-8",
            "--model-api-key",
            "$ANTHROPIC_API_KEY",
        ],
    )
    assert result.exit_code == 0, result.output
    raw = json.loads(out.read_text())
    # every field is written out, with its default, so the file documents itself
    assert set(raw) == set(EvaluationRunConfig.model_fields)
    config = EvaluationRunConfig.load(out)
    assert config.task_id == "hello-world"
    assert config.model == "anthropic/claude-opus-4-8"
    assert config.model_api_key == "$ANTHROPIC_API_KEY"
    assert config.max_turns == EvaluationRunConfig.model_fields["max_turns"].default
    # saving what was loaded gives the same file
    again = tmp_path / "again.json"
    config.save(again)
    assert json.loads(again.read_text()) == raw


def test_create_run_config_edited_then_loaded(runner: CliRunner, tmp_path: Path) -> None:
    out = tmp_path / "rc.json"
    assert runner.invoke(app, ["create-run-config", "-o", str(out), "-t", "t"]).exit_code == 0
    data = json.loads(out.read_text())
    data["max_turns"] = 12
    data["reasoning_effort"] = "max"
    out.write_text(json.dumps(data))
    config = EvaluationRunConfig.load(out)
    assert (config.max_turns, config.reasoning_effort) == (12, "max")


def test_create_run_config_refuses_to_overwrite(runner: CliRunner, tmp_path: Path) -> None:
    out = write(tmp_path, {"task_id": "keep-me"}, "rc.json")
    result = runner.invoke(app, ["create-run-config", "-o", str(out), "-t", "other"])
    assert result.exit_code == 2
    assert "--force" in result.output
    assert json.loads(out.read_text()) == {"task_id": "keep-me"}
    forced = runner.invoke(app, ["create-run-config", "-o", str(out), "-t", "other", "--force"])
    assert forced.exit_code == 0, forced.output
    assert EvaluationRunConfig.load(out).task_id == "other"


def test_create_run_config_requires_a_task(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["create-run-config", "-o", str(tmp_path / "rc.json")])
    assert result.exit_code != 0
    assert not (tmp_path / "rc.json").exists()


def test_run_with_a_malformed_config_names_field_and_file(
    runner: CliRunner, tmp_path: Path
) -> None:
    path = write(tmp_path, {"task_id": "t", "max_turns": -3, "colour": "red"})
    result = runner.invoke(app, ["run", "--config", str(path), "--runtime", "local"])
    assert result.exit_code == 2
    output = " ".join(result.output.split())  # rich may wrap long lines
    assert "field 'max_turns'" in output
    assert "field 'colour'" in output
    assert path.name in output
    assert "Traceback" not in result.output
