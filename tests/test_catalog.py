"""The model catalog: its data, lookups, reasoning levels, and ``karotte models list``."""

from __future__ import annotations

import json
import os
import re

import pytest
from typer.testing import CliRunner

from karotte import catalog
from karotte.cli import _register, app
from karotte.errors import ConfigError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

KNOWN_LEVELS = {"minimal", "low", "medium", "high", "xhigh", "max"}


def test_curated_entries_are_well_formed() -> None:
    models = catalog.curated_models()
    ids = [m.id for m in models]
    assert len(ids) == len(set(ids)), "duplicate model ids"
    assert {m.provider for m in models} >= {"anthropic", "openai", "gemini", "mistral"}
    for info in models:
        assert re.fullmatch(r"[a-z]+/[A-Za-z0-9._-]+", info.id), info.id
        assert info.id.split("/")[0] == info.provider
        assert info.source == "karotte"
        assert set(info.reasoning_levels) <= KNOWN_LEVELS, info.id
        assert len(set(info.reasoning_levels)) == len(info.reasoning_levels)
        assert info.context_window is not None, info.id
        if info.max_output_tokens is None:
            assert info.notes, f"{info.id}: an unset output limit needs a note saying why"


def test_curated_limits_agree_with_litellms_model_map() -> None:
    disagreements = {}
    for info in catalog.curated_models():
        differences = catalog.litellm_differences(info)
        # the one deliberate deviation: an output limit we leave unset (with a note) because
        # litellm lists the context window as the output limit
        differences = [d for d in differences if not d.startswith("max_output_tokens: ours unset")]
        if differences:
            disagreements[info.id] = differences
    assert disagreements == {}


def test_lookup_prefers_the_curated_entry() -> None:
    info = catalog.lookup("anthropic/claude-opus-4-8")
    assert info is not None
    assert info.source == "karotte"
    assert info.max_output_tokens == 128_000
    assert info.reasoning_levels[-1] == "max"


def test_lookup_falls_back_to_litellm() -> None:
    info = catalog.lookup("openai/gpt-4o")
    assert info is not None
    assert info.source == "litellm"
    assert info.context_window and info.context_window >= 128_000
    assert info.max_output_tokens and info.max_output_tokens > 0
    assert catalog.lookup("openai/gpt-4o", use_litellm=False) is None


def test_lookup_checks_the_provider_of_a_litellm_entry() -> None:
    # gpt-5 exists, but not as an Anthropic model
    assert catalog.lookup("anthropic/gpt-5") is None


def test_unknown_model_is_none() -> None:
    assert catalog.lookup("openai/no-such-model-xyz") is None


@pytest.mark.parametrize(
    ("model", "effort", "expected"),
    [
        ("openai/gpt-5", "min", "minimal"),
        ("openai/gpt-5", "max", "high"),
        ("openai/gpt-5.5", "min", "low"),
        ("openai/gpt-5.5", "max", "xhigh"),
        ("anthropic/claude-opus-4-8", "max", "max"),
        ("anthropic/claude-sonnet-4-5", "max", "high"),
        ("mistral/mistral-medium-3.5", "min", "high"),
        ("openai/gpt-5", "medium", "medium"),  # provider levels pass through
        ("openai/gpt-5.5", "none", "none"),
        ("openai/gpt-5", None, None),
        ("openai/no-such-model-xyz", "low", "low"),
    ],
)
def test_resolve_reasoning_effort(model: str, effort: str | None, expected: str | None) -> None:
    assert catalog.resolve_reasoning_effort(model, effort, catalog.lookup(model)) == expected


@pytest.mark.parametrize("model", ["openai/no-such-model-xyz", "openai/gpt-4.1"])
def test_min_max_without_known_levels_is_a_config_error(model: str) -> None:
    with pytest.raises(ConfigError, match="reasoning_effort 'max'"):
        catalog.resolve_reasoning_effort(model, "max", catalog.lookup(model))


# ---- the CLI ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register()
    return CliRunner()


def test_models_list_json(runner: CliRunner) -> None:
    result = runner.invoke(app, ["models", "list", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["snapshot"] == catalog.load_catalog().snapshot
    ids = [m["id"] for m in data["models"]]
    assert ids == [m.id for m in catalog.curated_models()]
    first = data["models"][0]
    assert {"context_window", "max_output_tokens", "reasoning_levels"} <= set(first)


def test_models_list_provider_filter_and_check(runner: CliRunner) -> None:
    result = runner.invoke(app, ["models", "list", "--json", "--provider", "openai", "--check"])
    assert result.exit_code == 0, result.output
    models = json.loads(result.stdout)["models"]
    assert models and all(m["provider"] == "openai" for m in models)
    assert all(m["litellm_differences"] == [] for m in models)


def test_models_list_table(runner: CliRunner) -> None:
    result = runner.invoke(app, ["models", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "anthropic/claude-opus-4-8" in result.stdout
    assert "Snapshot of" in result.stdout


def test_models_list_unknown_provider(runner: CliRunner) -> None:
    result = runner.invoke(app, ["models", "list", "--provider", "nope"])
    assert result.exit_code == 2
    assert "no models of provider 'nope'" in result.output
