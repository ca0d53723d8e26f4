"""``karotte check --image``: verify an environment image's permission model and look for leaks.

Runs as root inside the image, as the last build step. Three parts:

1. **As the real student** (a forked child that drops to the student's uid, gid and groups):
   it must not list or read ``/root_data`` and ``/intermediate_data`` or the harness's venv
   (``/root/.venv``, which holds the task code and scoring scripts), must not create, change or
   rename anything in ``/workdir/shared`` (but may read it), and must be able to write
   ``/workdir/data``.
2. **A scan of the file system** (not crossing into other mounts, skipping /proc, /sys, /dev):
   the student owns nothing, and its group can write nothing, outside its writable places
   (``/workdir`` except ``/workdir/shared``, ``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/run/lock``);
   no file is world-writable and no directory is world-writable without the sticky bit.
3. **Leaked credentials**: ``.netrc``, ``.git-credentials``, AWS/kube/gcloud/Docker/Hugging Face
   credential files, SSH private keys, passwords or tokens inside pip/uv/npm/yarn/pypi configs,
   and secret-looking environment variables (``ENV`` or ``ARG`` of the build).

Every finding names the path and how to fix it. The root directory and the student user are
parameters, so the logic runs on the host against a fake root directory too.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

_MAX_PROBED_FILES = 200
_HEAD_BYTES = 128
_CONFIG_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class ImageLayout:
    """Where things are in the image, relative to ``root`` (``/`` in a real image)."""

    root: Path = Path("/")
    student: str = "student"
    expected_uid: int | None = 1000
    student_data: str = "workdir/data"
    shared_data: str = "workdir/shared"
    root_only: tuple[str, ...] = ("root_data", "intermediate_data", "root/.venv")
    # where the student may own files (minus shared_data, which is inside workdir)
    student_writable: tuple[str, ...] = ("workdir", "tmp", "var/tmp", "dev/shm", "run/lock")
    skipped: tuple[str, ...] = ("proc", "sys", "dev")
    # where a PEM private key is looked for by content (site-packages are left out)
    key_scan: tuple[str, ...] = (
        "root",
        "home",
        "workdir",
        "etc",
        "opt",
        "srv",
        "root_data",
        "intermediate_data",
        "tmp",
        "var/tmp",
    )

    def path(self, rel: str) -> Path:
        return self.root / rel


@dataclass(frozen=True)
class Finding:
    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{where}{self.problem}\n    fix: {self.fix}"


@dataclass
class StudentIds:
    uid: int
    gid: int
    groups: list[int] = field(default_factory=list)


# ---- helpers ------------------------------------------------------------------------------------


def _display(layout: ImageLayout, path: Path) -> str:
    """The path as it is inside the image (``/root_data/x``), whatever ``layout.root`` is."""
    try:
        rel = path.relative_to(layout.root)
    except ValueError:
        return str(path)
    return "/" + rel.as_posix() if rel.as_posix() != "." else "/"


def _under(rel: PurePosixPath, prefixes: tuple[str, ...]) -> bool:
    text = rel.as_posix()
    return any(text == p or text.startswith(p + "/") for p in prefixes)


def student_ids(layout: ImageLayout) -> StudentIds | None:
    try:
        entry = pwd.getpwnam(layout.student)
    except KeyError:
        return None
    groups = os.getgrouplist(layout.student, entry.pw_gid)
    return StudentIds(entry.pw_uid, entry.pw_gid, groups)


def walk(layout: ImageLayout) -> Iterator[tuple[Path, PurePosixPath, os.stat_result]]:
    """Every file and directory under the root (not following symlinks, not crossing mounts)."""
    root_dev = os.lstat(layout.root).st_dev
    for dirpath, dirnames, filenames in os.walk(layout.root, onerror=lambda e: None):
        current = Path(dirpath)
        rel_dir = PurePosixPath(current.relative_to(layout.root).as_posix())
        kept = []
        for name in dirnames:
            rel = rel_dir / name if rel_dir.as_posix() != "." else PurePosixPath(name)
            if _under(rel, layout.skipped):
                continue
            try:
                info = os.lstat(current / name)
            except OSError:
                continue
            yield current / name, rel, info
            if stat.S_ISDIR(info.st_mode) and info.st_dev == root_dev:
                kept.append(name)
        dirnames[:] = kept
        for name in filenames:
            rel = rel_dir / name if rel_dir.as_posix() != "." else PurePosixPath(name)
            try:
                info = os.lstat(current / name)
            except OSError:
                continue
            yield current / name, rel, info


# ---- file-system scan ---------------------------------------------------------------------------

_CREDENTIAL_FILES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(^|/)[._]netrc$"), "a .netrc holds login passwords"),
    (re.compile(r"(^|/)\.git-credentials$"), "git credentials"),
    (re.compile(r"(^|/)\.aws/credentials$"), "AWS credentials"),
    (re.compile(r"(^|/)\.kube/config$"), "a Kubernetes config (cluster credentials)"),
    (re.compile(r"(^|/)\.cache/huggingface/token$"), "a Hugging Face token"),
    (re.compile(r"(^|/)\.huggingface/token$"), "a Hugging Face token"),
    (
        re.compile(r"(^|/)\.config/gcloud/(credentials\.db|access_tokens\.db)$"),
        "gcloud credentials",
    ),
    (re.compile(r"(^|/)application_default_credentials\.json$"), "Google cloud credentials"),
    (re.compile(r"(^|/)\.config/gh/hosts\.yml$"), "a GitHub CLI token"),
    (re.compile(r"(^|/)\.ssh/id_[a-z0-9_]+$"), "an SSH private key"),
    (re.compile(r"(^|/)id_(rsa|dsa|ecdsa|ed25519)(_sk)?$"), "an SSH private key"),
]
_CONFIG_FILES = re.compile(
    r"(^|/)(pip\.conf|pip\.ini|uv\.toml|\.npmrc|\.yarnrc\.yml|\.yarnrc|\.pypirc|"
    r"\.docker/config\.json|\.condarc)$"
)
_SECRET_IN_CONFIG = [
    (re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@", re.I), "a URL with a password"),
    (
        re.compile(
            r"^\s*[\"']?(_authToken|_auth|npmAuthToken|password|token|auth)[\"']?\s*[=:]\s*\S",
            re.I | re.M,
        ),
        "a password or token",
    ),
    (re.compile(r"//[^\s]+:_authToken=", re.I), "an npm auth token"),
]
_PRIVATE_KEY = re.compile(rb"-----BEGIN ([A-Z0-9 ]+ )?PRIVATE KEY-----")
# keys that packages generate at install time for the machine itself, not anyone's credentials
_MACHINE_KEYS = re.compile(r"^etc/(ssh/ssh_host_[a-z0-9]+_key|ssl/private/ssl-cert-snakeoil\.key)$")
_SECRET_ENV = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|CREDENTIALS?$|PRIVATE_KEY|AUTH_?KEY)",
    re.I,
)
# names that point at something (the file scan covers the file) rather than hold it
_REFERENCE_ENV = re.compile(r"_(FILE|PATH|DIR|URL_FILE)$", re.I)


def _looks_like_a_secret(name: str, value: str) -> bool:
    """A secret-looking name with a value long enough to be one (flags like ``=1`` and paths
    are not secrets)."""
    if not _SECRET_ENV.search(name) or _REFERENCE_ENV.search(name):
        return False
    value = value.strip()
    return len(value) >= 8 and not value.startswith("/") and value.lower() not in {"true", "false"}


def _head(path: Path, size: int) -> bytes:
    try:
        with path.open("rb") as handle:
            return handle.read(size)
    except OSError:
        return b""


def scan_filesystem(layout: ImageLayout, ids: StudentIds | None) -> list[Finding]:
    """Ownership, world-writable entries and credential files (as root, no demotion needed)."""
    findings: list[Finding] = []
    writable = tuple(p for p in layout.student_writable)
    for path, rel, info in walk(layout):
        text = rel.as_posix()
        shown = _display(layout, path)
        mode = info.st_mode
        is_link = stat.S_ISLNK(mode)
        inside_writable = _under(rel, writable) and not _under(rel, (layout.shared_data,))
        if ids is not None and not inside_writable and not is_link:
            if info.st_uid == ids.uid:
                findings.append(
                    Finding(
                        shown,
                        f"owned by the student (uid {ids.uid}) outside its writable places",
                        f"chown root:root {shown} (only /workdir, /tmp and the like may be the "
                        "student's)",
                    )
                )
            elif info.st_gid in ids.groups and mode & stat.S_IWGRP:
                findings.append(
                    Finding(
                        shown,
                        f"writable by a group of the student (gid {info.st_gid})",
                        f"chmod g-w {shown} or chgrp root {shown}",
                    )
                )
        if not is_link and mode & stat.S_IWOTH:
            if stat.S_ISDIR(mode):
                if not mode & stat.S_ISVTX:
                    findings.append(
                        Finding(
                            shown,
                            "world-writable directory without the sticky bit",
                            f"chmod o-w {shown} (or chmod +t for a /tmp-like directory)",
                        )
                    )
            elif stat.S_ISREG(mode):
                findings.append(Finding(shown, "world-writable file", f"chmod o-w {shown}"))
        if not stat.S_ISREG(mode):
            continue
        findings.extend(_credential_findings(layout, path, text, shown))
    return findings


def _credential_findings(layout: ImageLayout, path: Path, text: str, shown: str) -> list[Finding]:
    found: list[Finding] = []
    fix = (
        f"remove {shown} from the image; pass secrets at build time with a secret mount "
        "(RUN --mount=type=secret), never COPY or ENV them"
    )
    for pattern, what in _CREDENTIAL_FILES:
        if pattern.search(text):
            found.append(Finding(shown, f"leaked credentials: {what}", fix))
            return found
    if _CONFIG_FILES.search(text):
        content = _head(path, _CONFIG_MAX_BYTES).decode("utf-8", "replace")
        for pattern, what in _SECRET_IN_CONFIG:
            if pattern.search(content):
                found.append(
                    Finding(
                        shown,
                        f"leaked credentials: {what} in a package-manager config",
                        f"remove the credentials from {shown} (use a secret mount at build "
                        "time and delete the file in the same RUN step)",
                    )
                )
                return found
    rel = PurePosixPath(text)
    if (
        _under(rel, layout.key_scan)
        and "site-packages" not in rel.parts
        and not _MACHINE_KEYS.match(text)
        and _PRIVATE_KEY.search(_head(path, _HEAD_BYTES))
    ):
        found.append(Finding(shown, "leaked credentials: a private key", fix))
    return found


def check_environment(env: Mapping[str, str]) -> list[Finding]:
    """Secret-looking variables in the build's environment (they stay in the image)."""
    return [
        Finding(
            f"${name}",
            "a secret-looking environment variable is set in the image",
            f"remove ENV/ARG {name} from the Containerfile; use a secret mount at build time or "
            "pass it when the run starts",
        )
        for name, value in sorted(env.items())
        if _looks_like_a_secret(name, value)
    ]


# ---- probes as the student ----------------------------------------------------------------------


def _files_below(path: Path, limit: int = _MAX_PROBED_FILES) -> tuple[list[str], list[str]]:
    """Up to ``limit`` files and directories below ``path`` (as root)."""
    files: list[str] = []
    dirs: list[str] = [str(path)]
    for dirpath, dirnames, filenames in os.walk(path):
        dirs.extend(str(Path(dirpath) / d) for d in dirnames)
        files.extend(str(Path(dirpath) / f) for f in filenames)
        if len(files) >= limit and len(dirs) >= limit:
            break
    return files[:limit], dirs[:limit]


def _probe_plan(layout: ImageLayout) -> dict[str, object]:
    plan: dict[str, object] = {"root_only": [], "shared": None, "student_data": None}
    root_only = []
    for rel in layout.root_only:
        path = layout.path(rel)
        if path.exists():
            files, dirs = _files_below(path)
            root_only.append({"path": str(path), "files": files, "dirs": dirs})
    plan["root_only"] = root_only
    shared = layout.path(layout.shared_data)
    if shared.is_dir():
        files, dirs = _files_below(shared)
        plan["shared"] = {"path": str(shared), "files": files, "dirs": dirs}
    data = layout.path(layout.student_data)
    if data.is_dir():
        plan["student_data"] = str(data)
    return plan


def _try_create(directory: str) -> bool:
    probe = os.path.join(directory, f".karotte-probe-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return True


def _can_open(path: str, flags: int) -> bool:
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


def _run_probes(plan: dict[str, object]) -> list[list[str]]:
    """Runs as the student. Returns [path, problem, fix] triples."""
    problems: list[list[str]] = []
    for entry in plan["root_only"]:  # type: ignore[attr-defined]
        top = entry["path"]
        fix = f"chown -R root:root {top} && chmod -R go-rwx {top}"
        for directory in entry["dirs"]:
            try:
                os.listdir(directory)
            except OSError:
                pass
            else:
                problems.append([directory, "the student can list this root-only directory", fix])
            if _try_create(directory):
                problems.append([directory, "the student can create files in it", fix])
        for path in entry["files"]:
            if _can_open(path, os.O_RDONLY):
                problems.append([path, "the student can read this root-only file", fix])
    shared = plan["shared"]
    if isinstance(shared, dict):
        top = shared["path"]
        fix = f"chown -R root:root {top} && chmod -R go-w,a+rX {top}"
        for directory in shared["dirs"]:
            if _try_create(directory):
                problems.append([directory, "the student can create files in shared data", fix])
        for path in shared["files"]:
            if _can_open(path, os.O_WRONLY):
                problems.append([path, "the student can write this shared file", fix])
            if not _can_open(path, os.O_RDONLY):
                problems.append([path, "the student cannot read this shared file", fix])
        moved = top.rstrip("/") + f".karotte-probe-{os.getpid()}"
        try:
            os.rename(top, moved)
        except OSError:
            pass
        else:
            os.rename(moved, top)
            parent = os.path.dirname(top.rstrip("/"))
            problems.append(
                [
                    top,
                    "the student can rename shared data away (and put its own in its place)",
                    f"make {parent} root-owned with the sticky bit: chown root:student {parent} "
                    f"&& chmod 1775 {parent}",
                ]
            )
    data = plan["student_data"]
    if isinstance(data, str) and not _try_create(data):
        problems.append(
            [data, "the student cannot write its data directory", f"chown -R student {data}"]
        )
    return problems


def probe_as_student(layout: ImageLayout, ids: StudentIds) -> list[Finding]:
    """Fork, drop to the student's ids, try what the student must (not) be able to do."""
    if os.geteuid() != 0:
        return [
            Finding(
                "",
                "cannot test the permission model as the student: not running as root",
                "run `karotte check --image` as root (the last RUN step of the Containerfile)",
            )
        ]
    plan = _probe_plan(layout)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(read_fd)
            os.setgroups(ids.groups)
            os.setgid(ids.gid)
            os.setuid(ids.uid)
            result: object = _run_probes(plan)
        except BaseException as exc:
            result = {"error": f"{type(exc).__name__}: {exc}"}
            code = 1
        try:
            data = json.dumps(result).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view) :]
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    with os.fdopen(read_fd, "rb") as reader:
        while chunk := reader.read(65536):
            chunks.append(chunk)
    os.waitpid(pid, 0)
    try:
        result = json.loads(b"".join(chunks) or b"null")
    except ValueError:
        result = None
    if not isinstance(result, list):
        error = result.get("error") if isinstance(result, dict) else "no answer"
        return [
            Finding("", f"the probe as the student failed: {error}", "report this as a Karotte bug")
        ]
    # one finding per kind of problem (a readable tree would give hundreds), with a count
    grouped: dict[tuple[str, str], list[str]] = {}
    for path, problem, fix in result:
        grouped.setdefault((problem, fix), []).append(path)
    findings = []
    for (problem, fix), paths in grouped.items():
        more = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
        findings.append(
            Finding(_display(layout, Path(paths[0])), problem + more, _strip_root(layout, fix))
        )
    return findings


def _strip_root(layout: ImageLayout, text: str) -> str:
    if layout.root == Path("/"):
        return text
    return text.replace(str(layout.root).rstrip("/") + "/", "/")


# ---- all of it ----------------------------------------------------------------------------------


def check_image(
    layout: ImageLayout | None = None, env: Mapping[str, str] | None = None
) -> list[Finding]:
    """Every check; an empty list means the image is fine."""
    layout = layout or ImageLayout()
    findings: list[Finding] = []
    ids = student_ids(layout)
    if ids is None:
        findings.append(
            Finding(
                "/etc/passwd",
                f"there is no user {layout.student!r}",
                f"useradd --uid 1000 --user-group --home-dir /workdir {layout.student}",
            )
        )
    elif layout.expected_uid is not None and ids.uid != layout.expected_uid:
        findings.append(
            Finding(
                "/etc/passwd",
                f"user {layout.student!r} has uid {ids.uid}, not {layout.expected_uid}",
                f"usermod --uid {layout.expected_uid} {layout.student}",
            )
        )
    for rel in (*layout.root_only[:2], layout.shared_data, layout.student_data):
        if not layout.path(rel).is_dir():
            findings.append(
                Finding(
                    "/" + rel,
                    "missing directory",
                    "COPY the environment's data folder there (see the default Containerfile)",
                )
            )
    findings.extend(scan_filesystem(layout, ids))
    if ids is not None:
        findings.extend(probe_as_student(layout, ids))
    findings.extend(check_environment(os.environ if env is None else env))
    return findings
