"""``karotte create-env``: make a new environment directory from a stack of templates.

Steps: check the name and that the target is empty → put a wheel of the running Karotte into
``.karotte/`` (unless the released one is wanted) → render the templates → write the files, a
copy of them as the merge base (``.karotte/base/``) and ``.manifest.json`` → ``uv lock``.
Anything that fails removes what this command created, and only that.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from karotte._version import __version__
from karotte.errors import ConfigError
from karotte.host.manifest import (
    BASE_DIR,
    KAROTTE_DIR,
    KarotteSource,
    Manifest,
    TemplateRecord,
)
from karotte.host.templates import Rendering, Template, render_templates, resolve_stack
from karotte.host.vendor import build_karotte_wheel, sha256_of

if TYPE_CHECKING:
    from karotte.sandbox.cli_agents.base import CliAgentAdapter

ENV_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
DEFAULT_TEMPLATE = "default"
LOCK_TIMEOUT_S = 900


@dataclass
class LockResult:
    ok: bool
    message: str = ""


@dataclass
class CreatedEnvironment:
    path: Path
    manifest: Manifest
    lock: LockResult | None
    warnings: list[str] = field(default_factory=list)


def validate_env_name(name: str) -> str:
    if not ENV_NAME.match(name):
        raise ConfigError(
            f"environment name {name!r} is not valid: use 1-63 lower-case letters, digits, '_' "
            "and '-', starting with a letter (it names the image). Pass --name to choose one."
        )
    return name


def template_variables(
    env_name: str, templates: list[Template], source: KarotteSource
) -> dict[str, object]:
    """What every template file can use."""
    return {
        "env_name": env_name,
        "templates": [t.id for t in templates],
        "karotte_version": source.version,
        "karotte_requirement": f"karotte=={source.version}",
        "karotte_wheel": source.path,
    }


def render_environment(
    env_name: str, templates: list[Template], source: KarotteSource
) -> Rendering:
    return render_templates(templates, template_variables(env_name, templates, source))


def template_records(templates: list[Template]) -> list[TemplateRecord]:
    return [
        TemplateRecord(
            id=t.id, distribution=t.distribution, distribution_version=t.distribution_version
        )
        for t in templates
    ]


def write_rendering(env_dir: Path, rendering: Rendering, only: set[str] | None = None) -> None:
    """Write the rendered files (or ``only`` those) into ``env_dir``."""
    for rel, rendered in rendering.files.items():
        if only is not None and rel not in only:
            continue
        write_file(env_dir / rel, rendered.content, rendered.executable)


def write_file(path: Path, content: bytes, executable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    path.write_bytes(content)
    mode = path.stat().st_mode
    path.chmod(mode | 0o111 if executable else mode & ~0o111)


def write_base(env_dir: Path, rendering: Rendering) -> dict[str, str]:
    """Replace ``.karotte/base/`` with the rendered files; return their hashes."""
    base = env_dir / BASE_DIR
    if base.exists():
        shutil.rmtree(base)
    write_rendering(base, rendering)
    return {rel: sha256_of(base / rel) for rel in sorted(rendering.files)}


def karotte_source(env_dir: Path, from_index: bool) -> KarotteSource:
    """Vendor a wheel of the running Karotte into ``.karotte/`` (or use the released one)."""
    if from_index:
        return KarotteSource(kind="index", version=__version__)
    wheel = build_karotte_wheel(env_dir / KAROTTE_DIR)
    return KarotteSource(
        kind="wheel",
        version=__version__,
        path=wheel.relative_to(env_dir).as_posix(),
        sha256=sha256_of(wheel),
    )


def uv_lock(env_dir: Path) -> LockResult:
    """Run ``uv lock``. Never raises: a missing uv or an unreachable index is a warning, since
    the environment is complete without its lock file (``uv sync`` makes one)."""
    uv = shutil.which("uv")
    if uv is None:
        return LockResult(
            False,
            "uv is not on PATH, so no uv.lock was made; install uv and run `uv lock` in the "
            "environment",
        )
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "UV_PROJECT"}}
    try:
        proc = subprocess.run(
            # --upgrade-package: the vendored wheel keeps its name across karotte changes of
            # the same version, and a plain `uv lock` would keep the old wheel's hash
            [uv, "lock", "--quiet", "--upgrade-package", "karotte"],
            cwd=env_dir,
            capture_output=True,
            text=True,
            check=False,
            timeout=LOCK_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return LockResult(False, f"`uv lock` took longer than {LOCK_TIMEOUT_S}s; run it again")
    if proc.returncode != 0:
        return LockResult(
            False,
            "`uv lock` failed (is the package index reachable?), so uv.lock is missing or "
            f"stale; run `uv lock` in the environment later:\n{proc.stderr.strip()[-1500:]}",
        )
    return LockResult(True)


@contextmanager
def _rollback_on_failure(target: Path) -> Iterator[None]:
    """Remove what was created under ``target`` (and ``target`` itself, and parents, if they
    did not exist) when the body fails, including on Ctrl-C."""
    missing = [p for p in (target, *target.parents) if not p.exists()]
    topmost_created = missing[-1] if missing else None
    try:
        yield
    except BaseException:
        if topmost_created is not None:
            shutil.rmtree(topmost_created, ignore_errors=True)
        elif target.is_dir():
            # the target existed and was empty: everything in it is ours
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        raise


def _check_target(target: Path) -> None:
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            raise ConfigError(f"{target} exists and is not a directory")
        entries = sorted(p.name for p in target.iterdir())
        if entries:
            shown = ", ".join(entries[:5]) + (" …" if len(entries) > 5 else "")
            raise ConfigError(
                f"{target} is not empty ({shown}); create the environment in a new or empty "
                "directory, or use `karotte update` to bring an existing environment up to date"
            )


def _cli_adapters(names: Sequence[str]) -> list[CliAgentAdapter]:
    """The adapters of ``create-env --agent`` (an unknown name fails before anything is made)."""
    if not names:
        return []
    from karotte.sandbox.cli_agents.registry import get_adapter

    return [get_adapter(name) for name in dict.fromkeys(names)]


def create_env(
    target: Path,
    templates: Sequence[str] = (DEFAULT_TEMPLATE,),
    *,
    name: str | None = None,
    karotte_from_index: bool = False,
    lock: bool = True,
    agents: Sequence[str] = (),
    fetch_agents: bool = True,
) -> CreatedEnvironment:
    """Create an environment in ``target`` (new or empty). See the module docstring."""
    target = Path(os.path.abspath(target))
    env_name = validate_env_name(name if name is not None else target.name)
    _check_target(target)
    requested = list(templates) or [DEFAULT_TEMPLATE]
    stack = resolve_stack(requested)
    warnings: list[str] = []
    cli_agents = _cli_adapters(agents)
    with _rollback_on_failure(target):
        target.mkdir(parents=True, exist_ok=True)
        source = karotte_source(target, karotte_from_index)
        rendering = render_environment(env_name, stack, source)
        write_rendering(target, rendering)
        if cli_agents:  # their install steps go into the Containerfile (docs/cli-agents.md)
            from karotte.sandbox.cli_agents.containerfile import add_agents

            add_agents(target, cli_agents, fetch=fetch_agents)
        records = template_records(stack)
        manifest = Manifest(
            env_name=env_name,
            karotte_version=__version__,
            karotte_source=source,
            templates=requested,
            resolved_templates=records,
            extra_template_packages=[r for r in records if r.distribution != "karotte"],
            base_files=write_base(target, rendering),
        )
        manifest.save(target)
        lock_result = uv_lock(target) if lock else None
    if lock_result is not None and not lock_result.ok:
        warnings.append(lock_result.message)
    return CreatedEnvironment(target, manifest, lock_result, warnings)
