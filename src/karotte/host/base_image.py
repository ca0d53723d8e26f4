"""The default base image ``karotte/base:<suite>``, made locally from Debian packages.

No container registry is needed: ``mmdebstrap`` assembles a minimal Debian root filesystem from
the Debian archive (a pinned suite, a pinned package list, ``SOURCE_DATE_EPOCH`` fixed, apt lists
and caches removed), and the engine imports it as an image. The *recipe* (everything that decides
the image's content) is hashed; the image is tagged both ``karotte/base:<suite>`` and
``karotte/base:<suite>-<hash>``, and an existing ``<suite>-<hash>`` tag means there is nothing to
do. The root filesystem tarball is cached on disk so a second engine (podman after docker) only
imports it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from karotte.errors import KarotteError
from karotte.host.runtimes.base import Runtime

BASE_REPOSITORY = "karotte/base"
DEFAULT_SUITE = "bookworm"
LABEL_BASE_RECIPE = "dev.karotte.base-recipe"
# 2024-01-01T00:00:00Z. Changing it changes every file's mtime, hence the recipe hash.
SOURCE_DATE_EPOCH = 1704067200
RECIPE_VERSION = 1

# The image's Python, per Debian suite (what the wheelhouse must target).
SUITE_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}
# glibc of each suite: the newest manylinux tag its Python accepts.
SUITE_GLIBC = {"bookworm": (2, 36), "trixie": (2, 41)}

# What the harness needs inside the sandbox; nothing more (no sudo, no compiler).
BASE_PACKAGES: tuple[str, ...] = (
    "bash",
    "ca-certificates",
    "coreutils",
    "e2fsprogs",
    "iproute2",
    "iptables",
    "mount",
    "nftables",
    "passwd",
    "procps",
    "python3",
    "python3-venv",
    "util-linux",
)
# Documentation and translations are not needed in a sandbox; licences stay.
DPKG_OPTIONS: tuple[str, ...] = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
MMDEBSTRAP_FIX = "apt-get install -y --no-install-recommends mmdebstrap"

ProgressCallback = Callable[[str], None]


class BaseImageError(KarotteError):
    """The base image could not be made. The message says why and what to do."""


class BaseImageRecipe(BaseModel):
    """Everything that decides the content of the base image. Its hash names the image."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recipe_version: int = RECIPE_VERSION
    suite: str = DEFAULT_SUITE
    architecture: str = Field(default_factory=lambda: debian_architecture())
    variant: str = "minbase"
    packages: tuple[str, ...] = BASE_PACKAGES
    dpkg_options: tuple[str, ...] = DPKG_OPTIONS
    mirror: str = "http://deb.debian.org/debian"
    security_mirror: str = "http://deb.debian.org/debian-security"
    source_date_epoch: int = SOURCE_DATE_EPOCH

    @classmethod
    def for_suite(cls, suite: str = DEFAULT_SUITE) -> BaseImageRecipe:
        recipe = cls(suite=suite)
        mirror = os.environ.get("KAROTTE_DEBIAN_MIRROR")
        security = os.environ.get("KAROTTE_DEBIAN_SECURITY_MIRROR")
        if mirror:
            recipe = recipe.model_copy(update={"mirror": mirror})
        if security is not None:
            recipe = recipe.model_copy(update={"security_mirror": security})
        return recipe

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def tag(self) -> str:
        """The floating tag environments use: ``karotte/base:bookworm``."""
        return f"{BASE_REPOSITORY}:{self.suite}"

    @property
    def pinned_tag(self) -> str:
        """The tag naming exactly this recipe: ``karotte/base:bookworm-<hash>``."""
        return f"{BASE_REPOSITORY}:{self.suite}-{self.digest}"

    @property
    def python_version(self) -> str:
        return SUITE_PYTHON.get(self.suite, "3.11")

    def sources(self) -> list[str]:
        """The apt sources of the image (also what mmdebstrap downloads from)."""
        lines = [
            f"deb {self.mirror} {self.suite} main",
            f"deb {self.mirror} {self.suite}-updates main",
        ]
        if self.security_mirror:
            lines.append(f"deb {self.security_mirror} {self.suite}-security main")
        return lines

    def mmdebstrap_command(self, output: Path) -> list[str]:
        argv = [
            "mmdebstrap",
            f"--variant={self.variant}",
            "--mode=auto",
            "--format=tar",
            f"--architectures={self.architecture}",
            f"--include={','.join(self.packages)}",
        ]
        argv += [f"--dpkgopt={option}" for option in self.dpkg_options]
        # No logs, caches or machine id with build-time content in the image.
        argv.append('--customize-hook=rm -f "$1"/var/log/dpkg.log "$1"/var/log/apt/*.log')
        argv.append('--customize-hook=rm -f "$1"/var/cache/ldconfig/aux-cache')
        argv += [self.suite, str(output), *self.sources()]
        return argv


class BaseImageResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tag: str
    pinned_tag: str
    recipe_hash: str
    built: bool = Field(description="False when the image already existed (nothing was done)")
    rootfs_cached: bool = False
    duration_s: float = 0.0


def debian_architecture() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        machine, machine
    )


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(root) / "karotte"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock so that parallel builds make the base image once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def base_image_current(runtime: Runtime, recipe: BaseImageRecipe) -> bool:
    return runtime.image_exists(recipe.pinned_tag) and runtime.image_exists(recipe.tag)


def ensure_base_image(
    runtime: Runtime,
    suite: str = DEFAULT_SUITE,
    force: bool = False,
    on_progress: ProgressCallback | None = None,
    on_output: ProgressCallback | None = None,
) -> BaseImageResult:
    """Make ``karotte/base:<suite>`` in ``runtime``'s image store unless it is already current.

    ``on_progress`` gets one short line per phase; ``on_output`` every line mmdebstrap and the
    engine print.
    """
    recipe = BaseImageRecipe.for_suite(suite)
    if suite not in SUITE_PYTHON:
        raise BaseImageError(
            f"unknown Debian suite {suite!r} for the base image; known: "
            f"{', '.join(sorted(SUITE_PYTHON))}"
        )
    started = time.monotonic()
    progress = on_progress or (lambda _line: None)
    with file_lock(cache_dir() / "base" / f"{suite}.lock"):
        if not force and base_image_current(runtime, recipe):
            return BaseImageResult(
                tag=recipe.tag,
                pinned_tag=recipe.pinned_tag,
                recipe_hash=recipe.digest,
                built=False,
            )
        tarball = cache_dir() / "base" / f"{suite}-{recipe.digest}.tar"
        rootfs_cached = tarball.is_file() and not force
        if not rootfs_cached:
            build_rootfs(recipe, tarball, progress, on_output)
        else:
            progress(f"using the cached root filesystem {tarball}")
        _import_and_tag(runtime, recipe, tarball, progress, on_output)
    return BaseImageResult(
        tag=recipe.tag,
        pinned_tag=recipe.pinned_tag,
        recipe_hash=recipe.digest,
        built=True,
        rootfs_cached=rootfs_cached,
        duration_s=time.monotonic() - started,
    )


def build_rootfs(
    recipe: BaseImageRecipe,
    tarball: Path,
    progress: ProgressCallback,
    on_output: ProgressCallback | None = None,
) -> None:
    """Run mmdebstrap; write the root filesystem tarball atomically to ``tarball``."""
    if shutil.which("mmdebstrap") is None:
        raise BaseImageError(
            "making the base image needs `mmdebstrap`, which is not installed.\n"
            f"fix (Debian/Ubuntu, as root): `{MMDEBSTRAP_FIX}` (or run scripts/setup-engines.sh);"
            " or build from a registry image instead: `karotte build --build-arg "
            "BASE_IMAGE=debian:bookworm`"
        )
    tarball.parent.mkdir(parents=True, exist_ok=True)
    progress(
        f"mmdebstrap: Debian {recipe.suite} ({recipe.variant}, {len(recipe.packages)} packages)"
    )
    env = dict(os.environ)
    env["SOURCE_DATE_EPOCH"] = str(recipe.source_date_epoch)
    env.setdefault("TMPDIR", "/tmp")
    partial = tarball.with_suffix(".tar.partial")
    partial.unlink(missing_ok=True)
    lines: list[str] = []
    proc = subprocess.Popen(
        recipe.mmdebstrap_command(partial),
        stdin=subprocess.DEVNULL,  # without a mirror on argv mmdebstrap would read stdin
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    assert proc.stdout is not None
    with proc:
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if on_output is not None:
                on_output(line)
            if line.startswith("I: ") and "tempdir" not in line:
                progress(f"mmdebstrap: {line[3:]}")
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = "\n".join(lines[-40:])
        hint = ""
        if os.geteuid() != 0:
            hint = (
                "\nhint: as a non-root user mmdebstrap needs unprivileged user namespaces and "
                "subuid/subgid ranges (`apt-get install uidmap`; /etc/subuid); or run "
                "`sudo karotte base`"
            )
        raise BaseImageError(
            f"mmdebstrap failed (exit {proc.returncode}) making Debian {recipe.suite}:\n"
            f"{tail}{hint}"
        )
    partial.replace(tarball)


def _import_and_tag(
    runtime: Runtime,
    recipe: BaseImageRecipe,
    tarball: Path,
    progress: ProgressCallback,
    on_output: ProgressCallback | None,
) -> None:
    """Import the tarball, then add labels, ENV and CMD in a one-step build (import has none)."""
    rootfs_tag = f"{BASE_REPOSITORY}-rootfs:{recipe.suite}-{recipe.digest}"
    progress(f"importing the root filesystem into {runtime.name} as {rootfs_tag}")
    runtime.import_rootfs(tarball, rootfs_tag)
    containerfile = "\n".join(
        [
            f"FROM {rootfs_tag}",
            f'LABEL {LABEL_BASE_RECIPE}="{recipe.digest}" '
            f'dev.karotte.base-suite="{recipe.suite}" '
            f'org.opencontainers.image.description="Debian {recipe.suite} {recipe.variant} '
            'for Karotte, made by karotte base"',
            "ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            'CMD ["/bin/bash"]',
            "",
        ]
    )
    with tempfile.TemporaryDirectory(prefix="karotte-base-") as tmp:
        context = Path(tmp)
        (context / "Containerfile").write_text(containerfile, encoding="utf-8")
        for tag in (recipe.pinned_tag, recipe.tag):
            progress(f"tagging {tag}")
            runtime.build(context, context / "Containerfile", tag, {}, on_output)
