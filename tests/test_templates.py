"""Templates: rendering, stacking (replace and block override via extends), discovery."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from envtemplates import make_template, template_root, write
from typer.testing import CliRunner

import karotte.cli.env  # noqa: F401  (registers the commands)
from karotte.cli import app
from karotte.errors import ConfigError
from karotte.host.templates import (
    discover_templates,
    load_template,
    matches_any,
    render_templates,
    resolve_stack,
)

__all__ = ["template_root"]

PAGE = """\
header {{ env_name }}
{% block body %}base body{% endblock %}
footer
"""


def _stack(template_root: Path) -> None:
    make_template(
        template_root,
        "base",
        {
            "greeting.txt.jinja": "Hello {{ env_name }} from {{ templates | join('+') }}\n",
            "page.txt": PAGE,
            "plain.txt": "only in base\n",
            "bin/run.sh": "#!/bin/sh\necho {{ karotte_version }}\n",
        },
    )
    (template_root / "base" / "bin" / "run.sh").chmod(0o755)
    (template_root / "base" / "blob.bin").write_bytes(b"\xff\xfe\x00{{ not jinja }}")
    make_template(
        template_root,
        "top",
        {
            "greeting.txt.jinja": "Replaced for {{ env_name }}\n",
            "page.txt": '{% extends "base/page.txt" %}{% block body %}top body{% endblock %}',
            "extra.txt": "from top\n",
        },
        requires=["base"],
    )


def test_render_strips_jinja_and_stacks(template_root: Path) -> None:
    _stack(template_root)
    stack = resolve_stack(["top"])
    assert [t.id for t in stack] == ["base", "top"]
    rendering = render_templates(stack, {"env_name": "demo", "karotte_version": "9.9"})
    files = rendering.files
    assert "greeting.txt" in files and "greeting.txt.jinja" not in files
    # a later template replaces the file
    assert files["greeting.txt"].content == b"Replaced for demo\n"
    assert files["greeting.txt"].template == "top"
    # ... or extends it and overrides a named block; the rest of the base file stays
    assert files["page.txt"].content.decode() == "header demo\ntop body\nfooter\n"
    assert files["plain.txt"].content == b"only in base\n"
    assert files["extra.txt"].template == "top"
    assert files["bin/run.sh"].executable and files["bin/run.sh"].content.endswith(b"echo 9.9\n")
    assert not files["plain.txt"].executable
    # a file that is not UTF-8 is copied untouched
    assert files["blob.bin"].content == b"\xff\xfe\x00{{ not jinja }}"
    assert "template.toml" not in files


def test_templates_variable_lists_the_stack(template_root: Path) -> None:
    _stack(template_root)
    stack = resolve_stack(["base", "top"])
    base_only = render_templates(stack[:1], {"env_name": "x", "karotte_version": "1"})
    assert base_only.files["greeting.txt"].content == b"Hello x from base\n"


def test_requires_resolved_once_in_order(template_root: Path) -> None:
    make_template(template_root, "a", {})
    make_template(template_root, "b", {}, requires=["a"])
    make_template(template_root, "c", {}, requires=["a", "b"])
    assert [t.id for t in resolve_stack(["c", "b", "a"])] == ["a", "b", "c"]


def test_cycle_and_unknown_template_are_errors(template_root: Path) -> None:
    make_template(template_root, "x", {}, requires=["y"])
    make_template(template_root, "y", {}, requires=["x"])
    with pytest.raises(ConfigError, match="cycle: x -> y -> x"):
        resolve_stack(["x"])
    make_template(template_root, "z", {}, requires=["missing"])
    with pytest.raises(ConfigError, match="no template 'missing' \\(required by 'z'\\)"):
        resolve_stack(["z"])


def test_undefined_variable_names_the_file(template_root: Path) -> None:
    make_template(template_root, "bad", {"sub/oops.txt": "{{ no_such_variable }}\n"})
    with pytest.raises(ConfigError, match=r"sub/oops.txt.*no_such_variable"):
        render_templates(resolve_stack(["bad"]), {"env_name": "e"})


def test_template_toml_is_validated(tmp_path: Path) -> None:
    write(tmp_path / "t" / "template.toml", 'description = "x"\nrequirez = []\n')
    with pytest.raises(ConfigError, match="requirez"):
        load_template(tmp_path / "t")


def test_matches_any() -> None:
    patterns = ["src/environment/tasks/example_task", "*.md", "root_data/a.txt"]
    assert matches_any("src/environment/tasks/example_task/task.py", patterns)
    assert matches_any("README.md", patterns)
    assert matches_any("root_data/a.txt", patterns)
    assert not matches_any("src/environment/tasks/other/task.py", patterns)


def _fake_distribution(site: Path) -> None:
    """A installed-looking package `acme-templates` registering the template `acme`."""
    package = site / "acme_templates" / "acme"
    write(package / "template.toml", 'description = "Acme"\nrequires = ["default"]\n')
    write(package / "__init__.py", "")
    write(package / "ACME.md.jinja", "acme for {{ env_name }}\n")
    write(site / "acme_templates" / "__init__.py", "")
    dist_info = site / "acme_templates-1.2.3.dist-info"
    write(dist_info / "METADATA", "Metadata-Version: 2.1\nName: acme-templates\nVersion: 1.2.3\n")
    write(dist_info / "entry_points.txt", "[karotte.templates]\nacme = acme_templates.acme\n")


def test_entry_point_templates_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_distribution(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    templates = discover_templates()
    assert "default" in templates
    acme = templates["acme"]
    assert acme.distribution == "acme-templates" and acme.distribution_version == "1.2.3"
    assert acme.path == tmp_path / "site" / "acme_templates" / "acme"
    assert [t.id for t in resolve_stack(["acme"])] == ["default", "acme"]
    sys.modules.pop("acme_templates.acme", None)
    sys.modules.pop("acme_templates", None)


def test_broken_or_clashing_template_packages_are_skipped_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from karotte.plugins import plugin_warnings

    site = tmp_path / "site"
    _fake_distribution(site)
    dist_info = site / "bad_templates-0.1.dist-info"
    write(dist_info / "METADATA", "Metadata-Version: 2.1\nName: bad-templates\nVersion: 0.1\n")
    write(
        dist_info / "entry_points.txt",
        "[karotte.templates]\ngone = bad_templates_missing.gone\ndefault = acme_templates.acme\n",
    )
    monkeypatch.syspath_prepend(str(site))
    templates = discover_templates()
    assert "acme" in templates  # the healthy package still works
    assert "gone" not in templates
    assert templates["default"].distribution != "bad-templates"  # Karotte's own is kept
    warnings = "\n".join(plugin_warnings())
    assert "template 'gone' of bad-templates" in warnings and "does not load" in warnings
    assert "template 'default' from bad-templates is skipped: it clashes" in warnings
    sys.modules.pop("acme_templates.acme", None)
    sys.modules.pop("acme_templates", None)


def test_templates_list_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_distribution(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    result = CliRunner().invoke(app, ["templates", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["id"]: row for row in json.loads(result.stdout)}
    assert rows["default"]["distribution"] == "karotte"
    assert rows["acme"]["requires"] == ["default"]
    assert rows["acme"]["distribution"] == "acme-templates"


def test_default_template_renders_per_contract() -> None:
    stack = resolve_stack(["default"])
    variables = {
        "env_name": "demo",
        "karotte_version": "0.1.0",
        "karotte_requirement": "karotte==0.1.0",
        "karotte_wheel": ".karotte/karotte-0.1.0-py3-none-any.whl",
    }
    files = render_templates(stack, variables).files
    for required in (
        "pyproject.toml",
        "Containerfile",
        "setup_data.py",
        "justfile",
        ".gitignore",
        ".dockerignore",
        "AGENTS.md",
        "CLAUDE.md",
        "LICENSE",
        "src/environment/__init__.py",
        "src/environment/paths.py",
        "src/environment/system_prompts.py",
        "src/environment/fake_model.py",
        "src/environment/tasks/example_task/task.py",
        "src/environment/tasks/_template/task.py",
        "student_data/.gitkeep",
        "shared_data/.gitkeep",
        "root_data/.gitkeep",
        "intermediate_data/.gitkeep",
    ):
        assert required in files, required
    containerfile = files["Containerfile"].content.decode()
    assert "ARG BASE_IMAGE=karotte/base:bookworm\nFROM ${BASE_IMAGE}\n" in containerfile
    assert 'LABEL dev.karotte.environment="demo"' in containerfile
    run_lines = [line for line in containerfile.splitlines() if line.startswith("RUN ")]
    assert run_lines[-1] == "RUN /root/.venv/bin/karotte check --image"
    # karotte and its dependencies come only from the wheelhouse, dependencies in their own layer
    assert "COPY .karotte/build/deps/" in containerfile
    assert containerfile.index(".karotte/build/deps/") < containerfile.index(".karotte/build/env/")
    assert containerfile.count("pip install --no-cache-dir --no-index --no-deps") == 2
    pyproject = files["pyproject.toml"].content.decode()
    assert 'karotte = { path = ".karotte/karotte-0.1.0-py3-none-any.whl" }' in pyproject
    assert 'exclude-newer = "7 days"' in pyproject and "karotte = false" in pyproject
    assert "MIT No Attribution" in files["LICENSE"].content.decode()
    justfile = files["justfile"].content.decode()
    assert "{{args}}" in justfile and "{{id}}" in justfile  # just's own syntax survives Jinja
    setup = files["setup_data.py"].content.decode()
    assert setup.startswith("# /// script\n")


def test_default_template_from_index_has_no_path_source() -> None:
    files = render_templates(
        resolve_stack(["default"]),
        {
            "env_name": "demo",
            "karotte_version": "0.1.0",
            "karotte_requirement": "karotte==0.1.0",
            "karotte_wheel": None,
        },
    ).files
    assert "[tool.uv.sources]" not in files["pyproject.toml"].content.decode()


def test_templates_are_in_the_wheel(tmp_path: Path) -> None:
    import zipfile

    from karotte.host.vendor import build_karotte_wheel

    wheel = build_karotte_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in (
        "template.toml",
        ".gitignore.jinja",
        ".dockerignore",
        "LICENSE",
        "student_data/.gitkeep",
        "src/environment/tasks/_template/task.py",
    ):
        assert f"karotte/templates/default/{rel}" in names, rel
    assert not any("__pycache__" in n for n in names)


def test_extends_by_output_name_and_default_containerfile_blocks(template_root: Path) -> None:
    import shutil

    from karotte.host import templates as templates_module

    real_default = Path(templates_module.__file__).resolve().parent.parent / "templates" / "default"
    shutil.copytree(real_default, template_root / "default")
    make_template(
        template_root,
        "gcc",
        {
            # by the output name: "default/Containerfile" finds Containerfile.jinja
            "Containerfile.jinja": (
                '{% extends "default/Containerfile" %}'
                "{% block system_packages %}RUN apt-get install -y gcc\n{% endblock %}"
            ),
        },
        requires=["default"],
    )
    variables = {
        "env_name": "demo",
        "karotte_version": "0.1.0",
        "karotte_requirement": "karotte==0.1.0",
        "karotte_wheel": None,
    }
    files = render_templates(resolve_stack(["gcc"]), variables).files
    containerfile = files["Containerfile"].content.decode()
    assert "RUN apt-get install -y gcc\n" in containerfile
    assert "# Debian packages the tasks need" not in containerfile  # the block was replaced
    assert containerfile.rstrip().endswith("RUN /root/.venv/bin/karotte check --image")
    assert files["Containerfile"].template == "gcc"
