"""The build context's wheelhouse: every wheel the image installs, so it needs no package index.

``karotte build`` fills ``<env>/.karotte/build/wheels/`` with wheels of the environment package,
Karotte (from the environment's vendored copy) and all their runtime dependencies, exactly as
pinned in the environment's ``uv.lock``, for the image's Python (3.11 on Debian bookworm) and this
machine's architecture. The Containerfile installs them with
``pip install --no-index --find-links .karotte/build/wheels``. The same files are also split (hard
links) into ``.karotte/build/deps/`` (everything but the environment's own wheel; changes only
with ``uv.lock``) and ``.karotte/build/env/`` (the environment's wheel), so a Containerfile can
install the dependencies in a layer that stays cached while tasks are edited.

Steps: ``uv export`` lists the packages of the lock that the image needs (markers evaluated for
the image's Python/Linux), the best wheel of each is picked among the files the lock records
(verified against the lock's sha256, cached in ``~/.cache/karotte/wheels``), local path
dependencies are copied (wheels) or built (``uv build --wheel``), and the environment's own wheel
is built. The result is keyed by a hash of ``uv.lock``, ``pyproject.toml``, the sources and the
target, so an unchanged environment does no work; files get a fixed mtime so the engine's layer
cache keeps hitting.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from karotte.errors import KarotteError
from karotte.host.base_image import SOURCE_DATE_EPOCH, cache_dir, file_lock

WHEELHOUSE_DIR = ".karotte/build/wheels"  # everything (the contract's wheelhouse)
DEPS_DIR = ".karotte/build/deps"  # the same minus the environment's own wheel
ENV_WHEEL_DIR = ".karotte/build/env"  # only the environment's own wheel
WHEELHOUSE_RECORD = ".karotte/build/wheelhouse.json"
WHEELHOUSE_VERSION = 2
# Never part of the key: build output, virtualenvs, caches.
_SKIP_PARTS = {"__pycache__", ".venv", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache"}

ProgressCallback = Callable[[str], None]


class WheelhouseError(KarotteError):
    """The wheelhouse could not be made. The message names the package and what to do."""


class WheelTarget(BaseModel):
    """The Python the wheels are for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    python_version: str = "3.11"
    architecture: str = Field(default_factory=lambda: platform.machine().lower())
    glibc: tuple[int, int] = (2, 36)

    @property
    def python_tuple(self) -> tuple[int, int]:
        major, minor = self.python_version.split(".")[:2]
        return int(major), int(minor)


class WheelhouseResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    directory: Path
    key: str
    wheels: list[str]
    reused: bool = Field(description="True when the existing wheelhouse was current")
    duration_s: float = 0.0


class _Requirement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    version: str


def wheelhouse_key(env_dir: Path, target: WheelTarget) -> str:
    """Hash of everything that decides the wheelhouse's content."""
    digest = hashlib.sha256()
    digest.update(f"v{WHEELHOUSE_VERSION} {target.model_dump_json()}\n".encode())
    for name in ("pyproject.toml", "uv.lock", "README.md", "LICENSE"):
        path = env_dir / name
        if path.is_file():
            digest.update(f"{name}\n".encode())
            digest.update(path.read_bytes())
    for root in _local_source_roots(env_dir):
        for path in _tree_files(root):
            digest.update(str(path.relative_to(env_dir)).encode() + b"\n")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _local_source_roots(env_dir: Path) -> list[Path]:
    """The environment's sources and every local path dependency (from ``[tool.uv.sources]``)."""
    roots = [env_dir / "src"]
    try:
        pyproject = tomllib.loads((env_dir / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return roots
    sources = pyproject.get("tool", {}).get("uv", {}).get("sources", {})
    for spec in sources.values():
        for entry in spec if isinstance(spec, list) else [spec]:
            if isinstance(entry, dict) and isinstance(entry.get("path"), str):
                roots.append((env_dir / entry["path"]).resolve())
    return roots


def _tree_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        return []
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not _SKIP_PARTS.intersection(path.parts) and path.suffix != ".pyc":
            files.append(path)
    return files


def prepare_wheelhouse(
    env_dir: Path,
    target: WheelTarget | None = None,
    force: bool = False,
    on_progress: ProgressCallback | None = None,
) -> WheelhouseResult:
    """Make (or reuse) ``<env_dir>/.karotte/build/wheels``."""
    started = time.monotonic()
    env_dir = env_dir.resolve()
    target = target or WheelTarget()
    progress = on_progress or (lambda _line: None)
    if not (env_dir / "uv.lock").is_file():
        raise WheelhouseError(
            f"{env_dir} has no uv.lock; run `uv lock` in the environment first (the image "
            "installs exactly what the lock pins)"
        )
    (env_dir / WHEELHOUSE_DIR).parent.mkdir(parents=True, exist_ok=True)
    with file_lock((env_dir / WHEELHOUSE_DIR).parent / ".lock"):
        return _prepare_locked(env_dir, target, force, progress, started)


def _prepare_locked(
    env_dir: Path,
    target: WheelTarget,
    force: bool,
    progress: ProgressCallback,
    started: float,
) -> WheelhouseResult:
    key = wheelhouse_key(env_dir, target)
    directory = env_dir / WHEELHOUSE_DIR
    record_path = env_dir / WHEELHOUSE_RECORD
    if not force and record_path.is_file():
        try:
            record = json.loads(record_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            record = {}
        wheels = record.get("wheels", [])
        if (
            record.get("key") == key
            and isinstance(wheels, list)
            and sorted(p.name for p in directory.glob("*.whl")) == sorted(wheels)
            and (directory.parent / "deps").is_dir()
            and (directory.parent / "env").is_dir()
        ):
            return WheelhouseResult(
                directory=directory,
                key=key,
                wheels=wheels,
                reused=True,
                duration_s=time.monotonic() - started,
            )

    build_dir = directory.parent
    build_dir.mkdir(parents=True, exist_ok=True)
    staging_root = Path(tempfile.mkdtemp(prefix=".staging.", dir=build_dir))
    staging = staging_root / "wheels"
    staging.mkdir()
    try:
        progress("resolving the locked dependencies (uv export)")
        requirements, local_paths = _exported_requirements(env_dir, target)
        progress(f"fetching {len(requirements)} locked wheels")
        _fetch_locked_wheels(env_dir, requirements, target, staging, progress)
        for path in local_paths:
            progress(f"adding local dependency {path.name}")
            _add_local(path, staging)
        progress("building the environment's wheel (uv build)")
        own = _uv_build_wheel(env_dir, staging)
        wheels = sorted(p.name for p in staging.glob("*.whl"))
        _check_no_duplicates(wheels)
        # The same files split in two (hard links): dependencies change with uv.lock only,
        # the environment's wheel with every source edit; a Containerfile that installs them in
        # two steps keeps the slow dependency layer cached while tasks are edited.
        for name, subset in (
            ("deps", [w for w in wheels if w not in own]),
            ("env", [w for w in wheels if w in own]),
        ):
            (staging_root / name).mkdir()
            for wheel in subset:
                os.link(staging / wheel, staging_root / name / wheel)
        for sub in ("wheels", "deps", "env"):
            part = staging_root / sub
            for path in part.iterdir():
                os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
            part.chmod(0o755)
            os.utime(part, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))
        for sub in ("wheels", "deps", "env"):
            final = build_dir / sub
            if final.exists():
                shutil.rmtree(final)
            (staging_root / sub).rename(final)
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)
    record_path.write_text(
        json.dumps({"key": key, "target": target.model_dump(mode="json"), "wheels": wheels}) + "\n",
        encoding="utf-8",
    )
    return WheelhouseResult(
        directory=directory,
        key=key,
        wheels=wheels,
        reused=False,
        duration_s=time.monotonic() - started,
    )


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        raise WheelhouseError(
            "`uv` is not on PATH; the wheelhouse is made from the environment's uv.lock with it. "
            "Install uv: https://docs.astral.sh/uv/getting-started/installation/"
        )
    return uv


def _marker_environment(target: WheelTarget) -> dict[str, str]:
    major, minor = target.python_tuple
    return {
        "implementation_name": "cpython",
        "implementation_version": f"{major}.{minor}.0",
        "os_name": "posix",
        "platform_machine": target.architecture,
        "platform_python_implementation": "CPython",
        "platform_system": "Linux",
        "python_full_version": f"{major}.{minor}.0",
        "python_version": f"{major}.{minor}",
        "sys_platform": "linux",
    }


def _exported_requirements(
    env_dir: Path, target: WheelTarget
) -> tuple[list[_Requirement], list[Path]]:
    """The pinned packages the image needs, and the local path dependencies."""
    from packaging.markers import Marker

    proc = subprocess.run(
        [
            _uv(),
            "export",
            "--locked",  # a lock that no longer matches pyproject.toml is an error, not ignored
            "--no-dev",
            "--no-emit-project",
            "--no-hashes",
            "--no-header",
            "--no-annotate",
            "--format",
            "requirements.txt",
        ],
        cwd=env_dir,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if proc.returncode != 0:
        raise WheelhouseError(
            f"`uv export --locked` failed in {env_dir}; if uv.lock is out of date with "
            "pyproject.toml, run `uv lock` there:\n"
            f"{proc.stderr.strip()[-2000:]}"
        )
    environment = _marker_environment(target)
    requirements: list[_Requirement] = []
    local: list[Path] = []
    for raw in proc.stdout.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        spec, _, marker = line.partition(";")
        spec = spec.strip()
        if marker.strip() and not Marker(marker.strip()).evaluate(environment):
            continue
        if spec.startswith("-e "):
            spec = spec[3:].strip()
        if spec.startswith(("./", "../", "/", "file:")):
            path = spec.removeprefix("file://")
            local.append((env_dir / path).resolve())
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?==([^\s]+)", spec)
        if match is None:
            raise WheelhouseError(
                f"cannot make a wheel for the requirement {spec!r} from {env_dir}/uv.lock "
                "(only registry packages and local paths are supported)"
            )
        requirements.append(_Requirement(name=match.group(1), version=match.group(3)))
    return requirements, local


def _supported_tags(target: WheelTarget) -> list[str]:
    """Wheel tags the image's Python accepts, best first."""
    from packaging import tags

    arch = target.architecture
    glibc_major, glibc_minor = target.glibc
    platforms: list[str] = []
    for minor in range(glibc_minor, 4, -1):
        platforms.append(f"manylinux_{glibc_major}_{minor}_{arch}")
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}.get(minor)
        if legacy and (minor == 17 or arch in ("x86_64", "i686")):
            platforms.append(f"{legacy}_{arch}")
    major, minor_py = target.python_tuple
    interpreter = f"cp{major}{minor_py}"
    ordered = list(tags.cpython_tags((major, minor_py), abis=[interpreter], platforms=platforms))
    ordered += list(tags.compatible_tags((major, minor_py), interpreter, platforms))
    return [str(tag) for tag in ordered]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _fetch_locked_wheels(
    env_dir: Path,
    requirements: list[_Requirement],
    target: WheelTarget,
    out_dir: Path,
    progress: ProgressCallback,
) -> None:
    from packaging.utils import parse_wheel_filename

    lock = tomllib.loads((env_dir / "uv.lock").read_text(encoding="utf-8"))
    by_key: dict[tuple[str, str], dict[str, object]] = {}
    for package in lock.get("package", []):
        by_key[(_canonical(package["name"]), str(package.get("version", "")))] = package
    rank = {tag: index for index, tag in enumerate(_supported_tags(target))}
    downloads: list[tuple[str, str, str]] = []  # url, sha256, filename
    sdists: list[tuple[str, str, str]] = []
    for req in requirements:
        package = by_key.get((_canonical(req.name), req.version))
        if package is None:
            raise WheelhouseError(
                f"{req.name}=={req.version} is exported but not in uv.lock; run `uv lock`"
            )
        best: tuple[int, str, str, str] | None = None
        wheels = package.get("wheels", [])
        for wheel in wheels if isinstance(wheels, list) else []:
            url = str(wheel["url"])
            filename = url.rsplit("/", 1)[-1].split("#", 1)[0]
            try:
                wheel_tags = parse_wheel_filename(filename)[3]
            except ValueError:
                continue
            score = min((rank.get(str(tag), len(rank)) for tag in wheel_tags), default=len(rank))
            if score < len(rank) and (best is None or score < best[0]):
                best = (score, url, str(wheel.get("hash", "")), filename)
        if best is not None:
            downloads.append(best[1:])
            continue
        sdist = package.get("sdist")
        if isinstance(sdist, dict) and "url" in sdist:
            url = str(sdist["url"])
            sdists.append((url, str(sdist.get("hash", "")), url.rsplit("/", 1)[-1]))
            continue
        raise WheelhouseError(
            f"uv.lock has no wheel of {req.name}=={req.version} for Python "
            f"{target.python_version} on manylinux {target.architecture}, and no sdist; pin a "
            "version that ships one, or change the image's Python (--suite)"
        )

    def fetch(item: tuple[str, str, str]) -> Path:
        return _cached_download(*item)

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for path in pool.map(fetch, downloads):
            _link_or_copy(path, out_dir / path.name)
    for url, sha, filename in sdists:
        progress(f"building a wheel from the sdist {filename}")
        sdist_path = _cached_download(url, sha, filename)
        _uv_build_wheel(sdist_path, out_dir, pure_only=True)


def _cached_download(url: str, hash_spec: str, filename: str) -> Path:
    algorithm, _, expected = hash_spec.partition(":")
    if algorithm != "sha256" or not expected:
        raise WheelhouseError(f"uv.lock records no sha256 for {url}; refusing an unverified file")
    target = cache_dir() / "wheels" / expected / filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{filename}.{os.getpid()}.partial")
    if not url.startswith(("https://", "http://")):
        raise WheelhouseError(f"unsupported URL in uv.lock: {url}")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=120) as response, partial.open("wb") as out:  # noqa: S310
            for chunk in iter(lambda: response.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise WheelhouseError(f"downloading {url} failed: {exc}") from exc
    if digest.hexdigest() != expected:
        partial.unlink(missing_ok=True)
        raise WheelhouseError(
            f"{filename} does not match the sha256 in uv.lock (got {digest.hexdigest()}); "
            "refusing it"
        )
    partial.replace(target)
    return target


def _link_or_copy(source: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    shutil.copyfile(source, target)


def _add_local(path: Path, out_dir: Path) -> None:
    if path.is_file() and path.suffix == ".whl":
        _link_or_copy(path, out_dir / path.name)
    elif path.is_dir() or path.suffix in (".gz", ".zip"):
        _uv_build_wheel(path, out_dir)
    else:
        raise WheelhouseError(f"local dependency {path} does not exist or is not a wheel")


def _uv_build_wheel(source: Path, out_dir: Path, pure_only: bool = False) -> list[str]:
    """Build ``source`` (a project dir or sdist) into wheels in ``out_dir``; their names."""
    with tempfile.TemporaryDirectory(prefix="karotte-uv-build-") as tmp:
        env = dict(os.environ)
        env["SOURCE_DATE_EPOCH"] = str(SOURCE_DATE_EPOCH)  # reproducible wheel contents
        proc = subprocess.run(
            [_uv(), "build", "--wheel", "--quiet", "--out-dir", tmp, str(source)],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
            env=env,
        )
        built = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not built:
            raise WheelhouseError(
                f"`uv build --wheel {source}` failed (exit {proc.returncode}):\n"
                f"{proc.stderr.strip()[-2000:]}"
            )
        for wheel in built:
            if pure_only and not wheel.name.endswith("-none-any.whl"):
                raise WheelhouseError(
                    f"{source.name} has no wheel for the image and builds a platform-specific "
                    f"one ({wheel.name}) here; pin a version that ships manylinux wheels"
                )
            shutil.copyfile(wheel, out_dir / wheel.name)
        return [wheel.name for wheel in built]


def _check_no_duplicates(wheels: Iterable[str]) -> None:
    seen: dict[str, str] = {}
    for name in wheels:
        project = _canonical(name.split("-", 1)[0])
        if project in seen:
            raise WheelhouseError(
                f"two wheels of {project} in the wheelhouse: {seen[project]} and {name}"
            )
        seen[project] = name
