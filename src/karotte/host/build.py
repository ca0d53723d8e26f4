"""``karotte build``: turn an environment directory into an image.

1. the base image ``karotte/base:<suite>`` is made if the Containerfile uses it and it is missing
   (``karotte.host.base_image``); the build then pins it by its recipe tag;
2. the wheelhouse ``.karotte/build/wheels`` is made or reused (``karotte.host.wheelhouse``);
3. the runtime's engine builds the ``Containerfile`` (host network, layer cache); its output is
   parsed step by step, so a failure names the failing step and shows that step's output.

The launcher calls :func:`build_environment` (``karotte run`` builds first unless ``--dev``).
"""

from __future__ import annotations

import inspect
import json
import re
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from karotte.errors import ConfigError, KarotteError, RuntimeUnavailableError
from karotte.host.base_image import (
    BASE_REPOSITORY,
    SUITE_GLIBC,
    SUITE_PYTHON,
    ensure_base_image,
)
from karotte.host.manifest import MANIFEST_FILE
from karotte.host.runtimes import Runtime, get_runtime, select_default_runtime
from karotte.host.wheelhouse import WheelTarget, prepare_wheelhouse

CONTAINERFILE_NAMES = ("Containerfile", "Dockerfile")
TAG_REPOSITORY = "karotte-env"
LABEL_ENVIRONMENT = "dev.karotte.environment"
_LARGE_CONTEXT_BYTES = 200 * 1024 * 1024

LineCallback = Callable[[str], None]


class ImageBuildError(KarotteError):
    """The engine failed to build the image. The message names the step and shows its output."""

    def __init__(self, message: str, step: BuildStep | None = None) -> None:
        super().__init__(message)
        self.step = step


class BuildStep(BaseModel):
    model_config = ConfigDict(extra="forbid")

    number: int
    total: int
    instruction: str
    output: list[str] = Field(default_factory=list)
    cached: bool = False


class BuiltImage(BaseModel):
    """What :func:`build_environment` made."""

    model_config = ConfigDict(extra="forbid")

    tag: str
    image_id: str
    runtime: str
    env_name: str
    env_dir: Path
    base_image: str
    steps: int = 0
    cached_steps: int = 0
    wheelhouse_reused: bool = False
    base_image_built: bool = False
    duration_s: float = 0.0


# --- engine output ----------------------------------------------------------------------------

_STEP_PATTERNS = (
    re.compile(r"^Step (\d+)/(\d+) : (.*)$"),  # docker's classic builder
    re.compile(r"^STEP (\d+)/(\d+): (.*)$"),  # podman / buildah
    re.compile(r"^#\d+ \[(?:[\w.-]+ )?(\d+)/(\d+)\] (.*)$"),  # BuildKit, --progress=plain
)
# Engine chatter that is not the step's own output.
_NOISE = re.compile(
    r"^( ---> |Removing intermediate container |Successfully (built|tagged) |"
    r"Sending build context |--> |COMMIT |Getting image source|Copying (blob|config)|"
    r"Writing manifest|Storing signatures|DEPRECATED: The legacy builder|"
    r"\s+(Install the buildx|BuildKit is currently disabled|environment-variable\.)|"
    r"\s*$)"
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CACHE_MARKERS = (" ---> Using cache", "--> Using cache", " CACHED")
_ENGINE_ERROR = re.compile(
    r"(^The command .* returned a non-zero code|^Error:|^error:|^ERROR|"
    r"^Error response from daemon|did not complete successfully|^failed to )"
)


class BuildLog:
    """Follows an engine's build output and keeps each step's lines."""

    def __init__(self) -> None:
        self.steps: list[BuildStep] = []
        self.preamble: list[str] = []
        self.errors: list[str] = []
        self.context_bytes: int | None = None
        self._buildkit_ids: dict[str, int] = {}

    def feed(self, line: str) -> BuildStep | None:
        """Record one line; return the step when the line starts a new one."""
        text = _ANSI.sub("", line.rstrip("\n"))
        for pattern in _STEP_PATTERNS:
            match = pattern.match(text.strip())
            if match:
                number, total = int(match.group(1)), int(match.group(2))
                step = BuildStep(number=number, total=total, instruction=match.group(3).strip())
                if text.startswith("#"):
                    self._buildkit_ids[text.split(" ", 1)[0]] = len(self.steps)
                self.steps.append(step)
                return step
        if text.startswith("Sending build context to Docker daemon"):
            self.context_bytes = _parse_size(text.rsplit(" ", 1)[-1])
        if any(marker in text for marker in _CACHE_MARKERS) and self.steps:
            self.steps[-1].cached = True
        if _ENGINE_ERROR.search(text.strip()):
            self.errors.append(text.strip())
        target = self._target_for(text)
        if _NOISE.match(text):
            return None
        if target is None:
            self.preamble.append(text)
        else:
            target.output.append(_strip_buildkit_prefix(text))
        return None

    def _target_for(self, text: str) -> BuildStep | None:
        if text.startswith("#") and self._buildkit_ids:
            index = self._buildkit_ids.get(text.split(" ", 1)[0])
            return self.steps[index] if index is not None else None
        return self.steps[-1] if self.steps else None

    @property
    def current(self) -> BuildStep | None:
        return self.steps[-1] if self.steps else None

    def failure_message(self, tag: str, runtime: str, engine_message: str) -> str:
        step = self.current
        tail_lines = 60
        if step is None:
            lines = self.preamble[-tail_lines:] or engine_message.splitlines()[-tail_lines:]
            return f"building {tag} with {runtime} failed before the first step:\n" + "\n".join(
                f"  | {line}" for line in lines
            )
        output = [line for line in step.output if line.strip() not in self.errors]
        shown = output[-tail_lines:]
        more = len(output) - len(shown)
        parts = [
            f"building {tag} with {runtime} failed at step {step.number}/{step.total}: "
            f"{step.instruction}",
        ]
        if more:
            parts.append(f"  | … {more} earlier lines of this step not shown (use -v)")
        parts += [f"  | {line}" for line in shown] or ["  | (the step printed nothing)"]
        if self.errors:
            parts.append(f"engine: {self.errors[-1]}")
        return "\n".join(parts)


def _strip_buildkit_prefix(text: str) -> str:
    match = re.match(r"^#\d+ \d+(\.\d+)? (.*)$", text)
    return match.group(2) if match else text


def _parse_size(text: str) -> int | None:
    match = re.fullmatch(r"([\d.]+)([kMG]?B)", text.strip())
    if not match:
        return None
    factor = {"B": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}[match.group(2)]
    return int(float(match.group(1)) * factor)


# --- the environment --------------------------------------------------------------------------


def find_containerfile(env_dir: Path) -> Path:
    for name in CONTAINERFILE_NAMES:
        if (env_dir / name).is_file():
            return env_dir / name
    raise ConfigError(
        f"{env_dir} has no Containerfile: is it an environment made by `karotte create-env`?"
    )


def environment_name(env_dir: Path) -> str:
    """The environment's name: from ``.manifest.json`` (``create-env``), else ``pyproject.toml``.

    Every environment's Python package is called ``environment``, so the project name is only
    a fallback (it would give every environment the same tag).
    """
    try:
        manifest = json.loads((env_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
        if isinstance(manifest, dict) and isinstance(manifest.get("env_name"), str):
            return str(manifest["env_name"])
    except (OSError, json.JSONDecodeError):
        pass
    try:
        data = tomllib.loads((env_dir / "pyproject.toml").read_text(encoding="utf-8"))
        name = str(data["project"]["name"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        name = ""
    return env_dir.resolve().name if name in ("", "environment") else name


def default_tag(env_name: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", env_name.lower()).strip("-._") or "environment"
    return f"{TAG_REPOSITORY}/{slug}:latest"


def declared_base_image(containerfile: Path) -> str | None:
    """The default of ``ARG BASE_IMAGE=…`` (before the first FROM), if declared."""
    for raw in containerfile.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        match = re.match(r"^ARG\s+BASE_IMAGE(?:=(\S+))?\s*$", line, re.IGNORECASE)
        if match:
            return match.group(1).strip("\"'") if match.group(1) else None
        if re.match(r"^FROM\s", line, re.IGNORECASE):
            from_image = line.split()[1]
            return None if "$" in from_image else from_image
    return None


def karotte_base_suite(image: str | None) -> str | None:
    """``bookworm`` for ``karotte/base:bookworm`` (the images ``karotte base`` makes)."""
    if image and image.startswith(f"{BASE_REPOSITORY}:"):
        suite = image.split(":", 1)[1].split("-", 1)[0]
        return suite if suite in SUITE_PYTHON else None
    return None


def resolve_runtime(runtime: Runtime | str | None) -> Runtime:
    if isinstance(runtime, Runtime):
        return runtime
    name = runtime or select_default_runtime()[0]
    if name == "local":
        raise ConfigError(
            "the `local` runtime runs without an image; `karotte build` needs a container "
            "runtime (--runtime docker, podman or docker:gvisor)"
        )
    return get_runtime(name)


def _build_kwargs(runtime: Runtime, no_cache: bool) -> dict[str, bool]:
    if not no_cache:
        return {}
    if "no_cache" in inspect.signature(runtime.build).parameters:
        return {"no_cache": True}
    raise ConfigError(f"runtime {runtime.name!r} cannot build without its layer cache yet")


def build_environment(
    env_dir: Path,
    runtime: Runtime | str | None = None,
    tag: str | None = None,
    build_args: dict[str, str] | None = None,
    no_cache: bool = False,
    on_progress: LineCallback | None = None,
    on_output: LineCallback | None = None,
    python_version: str | None = None,
) -> BuiltImage:
    """Build the environment in ``env_dir`` into an image and return what was built.

    ``on_progress`` gets a short line per phase and per build step; ``on_output`` every line
    of engine output. ``python_version`` is the image's Python the wheelhouse targets (default:
    that of the karotte base image's Debian suite, 3.11 for other bases). Raises
    :class:`ImageBuildError` (failing step + its output) or
    :class:`~karotte.errors.RuntimeUnavailableError` (with the exact fix).
    """
    started = time.monotonic()
    env_dir = env_dir.resolve()
    progress = on_progress or (lambda _line: None)
    containerfile = find_containerfile(env_dir)
    env_name = environment_name(env_dir)
    tag = tag or default_tag(env_name)
    args = dict(build_args or {})
    engine = resolve_runtime(runtime)
    engine.ensure_available()
    kwargs = _build_kwargs(engine, no_cache)

    base_image = args.get("BASE_IMAGE") or declared_base_image(containerfile) or ""
    suite = karotte_base_suite(base_image)
    base_built = False
    if suite is not None:
        base = ensure_base_image(engine, suite, on_progress=progress, on_output=on_output)
        base_built = base.built
        if base_image == base.tag:
            # Pin the exact recipe, whatever the floating tag points to.
            args["BASE_IMAGE"] = base_image = base.pinned_tag
    target = WheelTarget(
        python_version=python_version or SUITE_PYTHON.get(suite or "bookworm", "3.11"),
        glibc=SUITE_GLIBC.get(suite or "bookworm", (2, 36)),
    )
    progress("preparing the wheelhouse")
    wheelhouse = prepare_wheelhouse(env_dir, target, force=no_cache, on_progress=progress)

    log = BuildLog()

    def follow(line: str) -> None:
        step = log.feed(line)
        if step is not None:
            short = " ".join(step.instruction.split())
            short = short if len(short) <= 90 else short[:89] + "…"
            progress(f"step {step.number}/{step.total}: {short}")
        if on_output is not None:
            on_output(line)

    progress(f"building {tag} with {engine.name}")
    try:
        image_id = engine.build(env_dir, containerfile, tag, args, follow, **kwargs)
    except RuntimeUnavailableError as exc:
        if log.current is None and not log.errors and "fix:" in str(exc):
            raise  # the engine is down or missing: its message holds the fix
        raise ImageBuildError(log.failure_message(tag, engine.name, str(exc)), log.current) from exc
    except KarotteError as exc:
        raise ImageBuildError(log.failure_message(tag, engine.name, str(exc)), log.current) from exc
    if log.context_bytes and log.context_bytes > _LARGE_CONTEXT_BYTES:
        progress(
            f"warning: the build context is {log.context_bytes / 1e6:.0f} MB; exclude "
            "virtualenvs and outputs in .dockerignore so rebuilds stay fast"
        )
    return BuiltImage(
        tag=tag,
        image_id=image_id,
        runtime=engine.name,
        env_name=env_name,
        env_dir=env_dir,
        base_image=base_image,
        steps=len(log.steps),
        cached_steps=sum(step.cached for step in log.steps),
        wheelhouse_reused=wheelhouse.reused,
        base_image_built=base_built,
        duration_s=time.monotonic() - started,
    )
