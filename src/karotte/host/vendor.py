"""A wheel of the running Karotte, for environments to depend on.

The package index may not serve ``karotte`` (or not the version a user runs from a checkout), so
``create-env`` and ``update`` put a wheel of the very Karotte that runs them into the
environment's ``.karotte/`` directory and point ``[tool.uv.sources]`` at it. The wheel is built
from the source checkout (``uv build --wheel``) when Karotte runs from one, and otherwise repacked
from the package directory and the installed distribution's metadata otherwise (or when uv is
missing).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata
import io
import shutil
import subprocess
import tempfile
import tomllib
import zipfile
from pathlib import Path

import karotte
from karotte._version import __version__
from karotte.errors import ConfigError

_cache: dict[str, Path] = {}


def wheel_name(version: str = __version__) -> str:
    return f"karotte-{version}-py3-none-any.whl"


def source_checkout() -> Path | None:
    """The source checkout Karotte is imported from (``<root>/src/karotte``), if any."""
    package_dir = Path(karotte.__file__).resolve().parent
    root = package_dir.parent.parent
    pyproject = root / "pyproject.toml"
    if package_dir.parent.name != "src" or not pyproject.is_file():
        return None
    try:
        name = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["name"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return None
    return root if name == "karotte" else None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build_karotte_wheel(out_dir: Path) -> Path:
    """Put a wheel of the running Karotte into ``out_dir`` and return its path.

    Built once per process and copied afterwards.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    key = __version__
    cached = _cache.get(key)
    if cached is None or not cached.is_file():
        cache_dir = Path(tempfile.mkdtemp(prefix="karotte-wheel-"))
        root = source_checkout()
        cached = _build_from_checkout(root, cache_dir) if root else _repack_installed(cache_dir)
        _cache[key] = cached
    target = out_dir / cached.name
    shutil.copyfile(cached, target)
    return target


def _build_from_checkout(root: Path, out_dir: Path) -> Path:
    uv = shutil.which("uv")
    if uv is None:  # no build front-end: pack the package directory as it is
        return _repack_installed(out_dir)
    proc = subprocess.run(
        [uv, "build", "--wheel", "--quiet", "--out-dir", str(out_dir), str(root)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    wheels = sorted(out_dir.glob("karotte-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ConfigError(
            f"building a wheel of Karotte from {root} failed (uv build exited with "
            f"{proc.returncode}):\n{proc.stderr.strip()[-2000:]}"
        )
    return wheels[-1]


def _repack_installed(out_dir: Path) -> Path:
    """Make a wheel from the imported ``karotte`` package directory and the installed
    distribution's metadata (works for regular and editable installs)."""
    try:
        dist = importlib.metadata.distribution("karotte")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ConfigError(
            "Karotte is neither run from a source checkout nor installed as a distribution, so "
            "no wheel of it can be made; pass --karotte-from-index"
        ) from exc
    dist_info = f"karotte-{dist.version}.dist-info"
    package_dir = Path(karotte.__file__).resolve().parent
    entries: list[tuple[str, bytes]] = []
    for path in sorted(package_dir.rglob("*")):
        rel = path.relative_to(package_dir)
        if path.is_dir() or "__pycache__" in rel.parts or path.suffix in (".pyc", ".pyo"):
            continue
        entries.append((f"karotte/{rel.as_posix()}", path.read_bytes()))
    kept_metadata = ("METADATA", "entry_points.txt", "licenses/")
    for file in dist.files or []:
        name = file.as_posix()
        if not name.startswith(f"{dist_info}/"):
            continue
        inner = name.split("/", 1)[1]
        if inner.startswith(kept_metadata):
            entries.append((name, Path(str(file.locate())).read_bytes()))
    if not any(name == f"{dist_info}/METADATA" for name, _ in entries):
        raise ConfigError(f"the installed karotte {dist.version} has no METADATA to repack")
    wheel_meta = (
        "Wheel-Version: 1.0\nGenerator: karotte-repack\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    entries.append((f"{dist_info}/WHEEL", wheel_meta.encode()))
    records = []
    target = out_dir / wheel_name(dist.version)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for name, data in entries:
            wheel.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            records.append((name, f"sha256={digest.decode()}", str(len(data))))
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerows(records)
        writer.writerow((f"{dist_info}/RECORD", "", ""))
        wheel.writestr(f"{dist_info}/RECORD", buffer.getvalue())
    return target
