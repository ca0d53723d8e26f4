"""The model catalog: output-token limits, context windows and reasoning levels of known models.

The curated list lives in ``karotte/data/models.json`` and is a snapshot (see its ``snapshot``
date): providers change limits and release models faster than any release of Karotte. A model
that is not curated is looked up in litellm's bundled model map (``litellm.model_cost``, local,
no network), and a model known to neither is still allowed: the client then sends no
``max_tokens`` and lets the provider apply its default.
"""

from __future__ import annotations

import functools
import os
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from karotte.errors import ConfigError

CatalogSource = Literal["karotte", "litellm"]


class ModelInfo(BaseModel):
    """What Karotte knows about one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="litellm model id, provider/name")
    provider: str
    context_window: int | None = Field(default=None, gt=0, description="max input tokens")
    max_output_tokens: int | None = Field(default=None, gt=0)
    reasoning_levels: tuple[str, ...] = Field(
        default=(), description="reasoning_effort values the model takes, lowest first"
    )
    supports_no_reasoning: bool = Field(
        default=False, description="reasoning_effort 'none' turns reasoning off"
    )
    notes: str | None = None
    source: CatalogSource = "karotte"

    @property
    def reasons(self) -> bool:
        return bool(self.reasoning_levels)


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid")

    snapshot: str
    note: str
    models: list[ModelInfo]


@functools.cache
def load_catalog() -> Catalog:
    """The curated catalog shipped with Karotte."""
    raw = resources.files("karotte.data").joinpath("models.json").read_text(encoding="utf-8")
    return Catalog.model_validate_json(raw)


def resolve_reasoning_effort(
    model_id: str, effort: str | None, info: ModelInfo | None
) -> str | None:
    """Map a run config's ``reasoning_effort`` to the value sent to the provider.

    ``min``/``max`` become the model's lowest/highest level from the catalog; ``None`` means
    "not sent"; every other value is a provider level and passes through unchanged.
    """
    if effort not in ("min", "max"):
        return effort
    if info is None or not info.reasoning_levels:
        why = "is not in the model catalog" if info is None else "has no known reasoning levels"
        raise ConfigError(
            f"reasoning_effort {effort!r}: model {model_id} {why}, so {effort!r} cannot be "
            "resolved; set a provider level (e.g. 'low', 'medium', 'high') or leave it unset"
        )
    return info.reasoning_levels[0] if effort == "min" else info.reasoning_levels[-1]


def curated_models() -> list[ModelInfo]:
    return list(load_catalog().models)


def lookup(model_id: str, *, use_litellm: bool = True) -> ModelInfo | None:
    """The catalog entry of ``model_id`` (``provider/name``), or ``None`` when unknown.

    Curated entries win; otherwise litellm's local model map is consulted (unless
    ``use_litellm`` is false, which avoids litellm's slow import).
    """
    for info in load_catalog().models:
        if info.id == model_id:
            return info
    if use_litellm:
        return litellm_info(model_id)
    return None


def litellm_info(model_id: str) -> ModelInfo | None:
    """What litellm's bundled model map says about ``model_id`` (no network)."""
    entry = _litellm_entry(model_id)
    if entry is None:
        return None
    provider = str(entry.get("litellm_provider") or model_id.partition("/")[0])
    levels: list[str] = []
    if entry.get("supports_reasoning"):
        declared = entry.get("reasoning_effort_levels")
        if isinstance(declared, list):
            levels = [str(level) for level in declared if level != "none"]
        else:
            levels = ["low", "medium", "high"]
            if entry.get("supports_minimal_reasoning_effort"):
                levels.insert(0, "minimal")
            if entry.get("supports_xhigh_reasoning_effort"):
                levels.append("xhigh")
            if entry.get("supports_max_reasoning_effort"):
                levels.append("max")
    declared_levels = entry.get("reasoning_effort_levels")
    no_reasoning = bool(entry.get("supports_none_reasoning_effort")) or (
        isinstance(declared_levels, list) and "none" in declared_levels
    )
    return ModelInfo(
        id=model_id,
        provider=provider,
        context_window=_positive(entry.get("max_input_tokens")),
        max_output_tokens=_positive(entry.get("max_output_tokens")),
        reasoning_levels=tuple(levels),
        supports_no_reasoning=no_reasoning,
        source="litellm",
    )


def litellm_differences(info: ModelInfo) -> list[str]:
    """Where a curated entry's limits differ from litellm's model map (empty = they agree).

    A limit litellm does not have is not a difference; a model litellm does not know is one.
    """
    theirs = litellm_info(info.id)
    if theirs is None:
        return ["not in litellm's model map"]
    found = []
    for name in ("context_window", "max_output_tokens"):
        ours, other = getattr(info, name), getattr(theirs, name)
        if other is not None and ours != other:
            found.append(f"{name}: ours {'unset' if ours is None else ours}, litellm {other}")
    return found


def _litellm_entry(model_id: str) -> dict[str, Any] | None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    cost_map: dict[str, dict[str, Any]] = litellm.model_cost
    provider, _, name = model_id.partition("/")
    for key in (model_id, name):
        entry = cost_map.get(key)
        if entry and (not name or entry.get("litellm_provider") in (provider, None)):
            return entry
    return None


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and value > 0 else None
