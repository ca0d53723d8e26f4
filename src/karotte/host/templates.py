"""Environment templates: finding them, reading ``template.toml``, stacking and rendering.

A template is a directory holding ``template.toml`` and the files of an environment. Every file
is rendered with Jinja2 (a ``.jinja`` suffix is stripped from the output name). Templates stack:
they are rendered in order (each one's ``requires`` first) and a later template replaces a file
of an earlier one, or extends it with ``{% extends "<template id>/<file>" %}`` and overrides its
named blocks.

Templates come from Karotte itself (``karotte/templates/<id>/``) and from any installed package
that registers one under the ``karotte.templates`` entry point group (see ``docs/templates.md``).
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import jinja2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from karotte.config import format_validation_error
from karotte.errors import ConfigError
from karotte.plugins import warn as warn_plugin

ENTRY_POINT_GROUP = "karotte.templates"
TEMPLATE_SPEC_FILE = "template.toml"
JINJA_SUFFIX = ".jinja"
BUILTIN_TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
TEMPLATE_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# never part of a rendered environment, wherever they turn up in a template directory
_IGNORED_NAMES = frozenset({"__pycache__", ".DS_Store", ".mypy_cache", ".ruff_cache"})
_IGNORED_SUFFIXES = (".pyc", ".pyo")


class TemplateSpec(BaseModel):
    """The contents of a template's ``template.toml``."""

    model_config = ConfigDict(extra="forbid")

    description: str = ""
    requires: list[str] = Field(default_factory=list)
    do_not_recreate_if_deleted: list[str] = Field(
        default_factory=list,
        description="Paths (or directories, or glob patterns) that `karotte update` does not "
        "bring back when the user deleted them.",
    )


@dataclass(frozen=True)
class Template:
    """A template found on this machine."""

    id: str
    path: Path
    spec: TemplateSpec
    # where it comes from: "karotte" or the distribution that registered it
    distribution: str = "karotte"
    distribution_version: str | None = None

    def files(self) -> list[PurePosixPath]:
        """Paths of the template's files, relative to its directory, sorted."""
        found: list[PurePosixPath] = []
        for path in sorted(self.path.rglob("*")):
            rel = path.relative_to(self.path)
            if any(part in _IGNORED_NAMES for part in rel.parts):
                continue
            if path.is_dir() or path.name.endswith(_IGNORED_SUFFIXES):
                continue
            if rel.as_posix() == TEMPLATE_SPEC_FILE:
                continue
            found.append(PurePosixPath(rel.as_posix()))
        return found


@dataclass(frozen=True)
class RenderedFile:
    """One file of a rendered environment."""

    content: bytes
    executable: bool = False
    template: str = ""  # id of the template that produced it


@dataclass
class Rendering:
    """The result of rendering a stack of templates: files by relative path."""

    templates: list[Template]
    files: dict[str, RenderedFile] = field(default_factory=dict)

    def do_not_recreate(self) -> list[str]:
        return [p for t in self.templates for p in t.spec.do_not_recreate_if_deleted]


def load_template(path: Path, template_id: str | None = None, **origin: Any) -> Template:
    """Read the template at ``path`` (a directory holding ``template.toml``)."""
    template_id = template_id or path.name
    if not TEMPLATE_ID.match(template_id):
        raise ConfigError(
            f"template id {template_id!r} ({path}): use lower-case letters, digits, '-' and '_'"
        )
    spec_file = path / TEMPLATE_SPEC_FILE
    try:
        data = tomllib.loads(spec_file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"template {template_id!r}: {spec_file} does not exist") from exc
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"template {template_id!r}: {spec_file}: {exc}") from exc
    try:
        spec = TemplateSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(spec_file))) from exc
    return Template(id=template_id, path=path, spec=spec, **origin)


def _entry_point_directory(ep: importlib.metadata.EntryPoint) -> Path:
    """An entry point names a package (its directory is the template) or a function returning
    the template directory."""
    value = ep.load()
    if isinstance(value, ModuleType):
        if value.__file__ is None:
            locations = list(getattr(value, "__path__", []))
            if not locations:
                raise ConfigError(f"entry point {ep.value!r} is a package without a directory")
            return Path(locations[0])
        return Path(value.__file__).parent
    if callable(value):
        value = value()
    if isinstance(value, str | Path):
        return Path(value)
    raise ConfigError(
        f"entry point {ep.name} = {ep.value!r} must name a package or a function returning the "
        f"template directory, got {type(value).__name__}"
    )


def discover_templates() -> dict[str, Template]:
    """Every template on this machine by id: Karotte's own, then those of installed packages.

    A package's template cannot shadow one of Karotte's; a clashing or broken template package
    is skipped with a warning (``karotte.plugins.plugin_warnings``).
    """
    templates: dict[str, Template] = {}
    if BUILTIN_TEMPLATES_DIR.is_dir():
        for path in sorted(BUILTIN_TEMPLATES_DIR.iterdir()):
            if (path / TEMPLATE_SPEC_FILE).is_file():
                templates[path.name] = load_template(path)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        dist_name = dist.metadata["Name"] if dist is not None else "(unknown)"
        # a broken template package is skipped with a warning, like every optional plugin
        if ep.name in templates:
            warn_plugin(
                f"template {ep.name!r} from {dist_name} is skipped: it clashes with the one "
                f"from {templates[ep.name].distribution}; rename the entry point"
            )
            continue
        try:
            directory = _entry_point_directory(ep)
            templates[ep.name] = load_template(
                directory,
                ep.name,
                distribution=dist_name,
                distribution_version=dist.version if dist is not None else None,
            )
        except Exception as exc:
            warn_plugin(
                f"template {ep.name!r} of {dist_name} ({ep.value}) is skipped: it does not "
                f"load: {type(exc).__name__}: {exc}"
            )
    return templates


def resolve_stack(
    requested: Iterable[str], available: Mapping[str, Template] | None = None
) -> list[Template]:
    """The templates to render, in order: each one's ``requires`` first, each at most once."""
    available = discover_templates() if available is None else available
    order: list[Template] = []
    seen: set[str] = set()

    def visit(template_id: str, chain: tuple[str, ...]) -> None:
        if template_id in chain:
            cycle = " -> ".join((*chain, template_id))
            raise ConfigError(f"templates require each other in a cycle: {cycle}")
        if template_id in seen:
            return
        if template_id not in available:
            known = ", ".join(sorted(available)) or "(none)"
            via = f" (required by {chain[-1]!r})" if chain else ""
            raise ConfigError(
                f"no template {template_id!r}{via}; known templates: {known} "
                "(see `karotte templates list`)"
            )
        template = available[template_id]
        for required in template.spec.requires:
            visit(required, (*chain, template_id))
        seen.add(template_id)
        order.append(template)

    for template_id in requested:
        visit(template_id, ())
    if not order:
        raise ConfigError("no template given")
    return order


def _output_name(rel: PurePosixPath) -> str:
    text = rel.as_posix()
    return text[: -len(JINJA_SUFFIX)] if text.endswith(JINJA_SUFFIX) else text


class _TemplateDirLoader(jinja2.FileSystemLoader):
    """Loads a template's file by its source name or by its output name (without ``.jinja``)."""

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str, Callable[[], bool]]:
        try:
            return super().get_source(environment, template)
        except jinja2.TemplateNotFound:
            return super().get_source(environment, template + JINJA_SUFFIX)


def _jinja_environment(templates: list[Template]) -> jinja2.Environment:
    loader = jinja2.PrefixLoader(
        {t.id: _TemplateDirLoader(str(t.path), encoding="utf-8") for t in templates},
        delimiter="/",
    )
    return jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701 - renders source code and config files, never HTML
    )


def render_templates(templates: list[Template], variables: Mapping[str, Any]) -> Rendering:
    """Render the stack in order; a later template's file replaces an earlier one's.

    Undefined variables are errors. A file that is not UTF-8 text is copied as is.
    """
    env = _jinja_environment(templates)
    context = dict(variables)
    context.setdefault("templates", [t.id for t in templates])
    rendering = Rendering(templates=list(templates))
    for template in templates:
        for rel in template.files():
            source = template.path / rel
            raw = source.read_bytes()
            executable = bool(source.stat().st_mode & 0o100)
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                content = raw
            else:
                try:
                    jinja_template = env.get_template(f"{template.id}/{rel.as_posix()}")
                    content = jinja_template.render(context).encode("utf-8")
                except jinja2.TemplateError as exc:
                    where = getattr(exc, "lineno", None)
                    line = f" line {where}" if where else ""
                    raise ConfigError(
                        f"template {template.id!r}: {rel}{line}: {type(exc).__name__}: {exc}"
                    ) from exc
            rendering.files[_output_name(rel)] = RenderedFile(
                content=content, executable=executable, template=template.id
            )
    return rendering


def matches_any(path: str, patterns: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``patterns``: an exact path, a directory above it, or a glob."""
    pure = PurePosixPath(path)
    for pattern in patterns:
        pattern = pattern.strip("/")
        if path == pattern or path.startswith(pattern + "/") or pure.match(pattern):
            return True
    return False
