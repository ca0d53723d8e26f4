"""Helpers shared by the template, create-env and update tests: small templates on disk."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from karotte.host import templates as templates_module


def write(path: Path, text: str, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    if mode is not None:
        path.chmod(mode)
    return path


def make_template(root: Path, template_id: str, files: dict[str, str], **spec: object) -> Path:
    directory = root / template_id
    lines = [f'description = "{spec.get("description", template_id + " template")}"']
    lines.append(f"requires = {list(spec.get('requires', []))!r}".replace("'", '"'))
    dnr = list(spec.get("do_not_recreate_if_deleted", []))  # type: ignore[call-overload]
    lines.append(f"do_not_recreate_if_deleted = {dnr!r}".replace("'", '"'))
    write(directory / "template.toml", "\n".join(lines) + "\n")
    for rel, text in files.items():
        write(directory / rel, text)
    return directory


@pytest.fixture
def template_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty directory that stands in for Karotte's own templates."""
    root = tmp_path / "templates"
    root.mkdir()
    monkeypatch.setattr(templates_module, "BUILTIN_TEMPLATES_DIR", root)
    return root
