"""Shared bits of the tests that drive the real litellm client against :mod:`provider_stub`."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# provider name -> (model id, suffix of api_base after the stub's URL)
PROVIDERS: dict[str, tuple[str, str]] = {
    "anthropic": ("anthropic/claude-sonnet-4-5", ""),
    "openai": ("openai/gpt-5", "/v1"),
}


def api_base(provider: str, stub_url: str) -> str:
    return stub_url + PROVIDERS[provider][1]


def model_id(provider: str) -> str:
    return PROVIDERS[provider][0]
