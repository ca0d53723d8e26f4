"""ExecutableJudge: runs a scoring script, with a timeout, and reads its JSON verdict."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from karotte.errors import JudgeError, StudentMisbehaviorError
from karotte.judges.base import Judge, JudgeContext, Scoring

_OUTPUT_TAIL = 4000


class ExecutableJudge(Judge):
    """Run ``script`` and read ``{"score": ..., "metadata": ...}`` from a JSON file it writes.

    * A ``.py`` script runs with the harness's own (root-owned) interpreter, ``sys.executable``,
      with ``PYTHONSAFEPATH=1`` and ``-I`` so nothing the student planted (``sitecustomize.py``,
      a ``python3`` on ``PATH``, ``PYTHONPATH``) is imported. Other scripts run directly.
    * The output path is passed as ``KAROTTE_SCORE_FILE`` in the environment and replaces the
      placeholder ``{score_file}`` in ``args``. Each submission copy is passed as
      ``KAROTTE_SUBMISSION_<n>`` (and ``{submission}`` is the first one).
    * The script gets ``timeout_s`` (default: the run's ``judge_timeout_s``). On timeout its
      whole process group is killed and the step fails as a judge error — or as misbehaviour with
      ``timeout_is_misbehavior=True`` (when only the student's code can make grading hang).
    * The verdict may carry ``"misbehavior": "<reason>"`` to report cheating.
    """

    def __init__(
        self,
        script: str | os.PathLike[str],
        args: Sequence[str] = (),
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        timeout_is_misbehavior: bool = False,
        name: str | None = None,
    ) -> None:
        self.script = Path(script)
        self.args = list(args)
        self.timeout_s = timeout_s
        self.env = dict(env or {})
        self.cwd = Path(cwd) if cwd is not None else None
        self.timeout_is_misbehavior = timeout_is_misbehavior
        self.name = name

    def _argv(self, score_file: Path, first_submission: str) -> list[str]:
        args = [
            a.replace("{score_file}", str(score_file)).replace("{submission}", first_submission)
            for a in self.args
        ]
        if self.script.suffix == ".py":
            return [sys.executable, "-I", str(self.script), *args]
        return [str(self.script), *args]

    async def score(self, context: JudgeContext) -> Scoring:
        if not self.script.is_file():
            raise JudgeError(f"scoring script {self.script} does not exist")
        timeout = self.timeout_s if self.timeout_s is not None else context.config.judge_timeout_s
        with tempfile.TemporaryDirectory(prefix="karotte-judge-") as tmp:
            os.chmod(tmp, 0o700)
            score_file = Path(tmp) / "score.json"
            copies = [str(p) for p in context.submissions.values()]
            env = _judge_environment(self.env, score_file, copies)
            argv = self._argv(score_file, copies[0] if copies else "")
            returncode, output = await _run_with_timeout(argv, env, self.cwd, timeout)
            if returncode is None:
                message = f"scoring script {self.script.name} timed out after {timeout:g}s"
                if self.timeout_is_misbehavior:
                    raise StudentMisbehaviorError(message)
                raise JudgeError(f"{message}; output tail:\n{output}")
            if returncode != 0:
                raise JudgeError(
                    f"scoring script {self.script.name} exited with {returncode}; "
                    f"output tail:\n{output}"
                )
            return _read_verdict(score_file, self.script.name)


def _judge_environment(
    extra: Mapping[str, str], score_file: Path, copies: list[str]
) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "LD_")) and k not in {"BASH_ENV", "ENV"}
    }
    env.update(extra)
    env["PYTHONSAFEPATH"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["KAROTTE_SCORE_FILE"] = str(score_file)
    for index, path in enumerate(copies):
        env[f"KAROTTE_SUBMISSION_{index}"] = path
    return env


async def _run_with_timeout(
    argv: list[str], env: dict[str, str], cwd: Path | None, timeout_s: float
) -> tuple[int | None, str]:
    """Run ``argv`` in its own session; on timeout kill the whole group. Returns (rc, tail)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    chunks: list[bytes] = []

    async def drain() -> None:
        assert proc.stdout is not None
        while data := await proc.stdout.read(65536):
            chunks.append(data)
            # keep only a bounded tail in memory: a grader can print gigabytes
            while sum(len(c) for c in chunks) > 4 * _OUTPUT_TAIL and len(chunks) > 1:
                chunks.pop(0)

    reader = asyncio.ensure_future(drain())
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
        returncode: int | None = proc.returncode
    except TimeoutError:
        returncode = None
    finally:
        _kill_group(proc.pid)
        await proc.wait()
        try:
            await asyncio.wait_for(reader, 2)
        except TimeoutError:
            reader.cancel()
    tail = b"".join(chunks).decode("utf-8", "replace")[-_OUTPUT_TAIL:]
    return returncode, tail


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _read_verdict(score_file: Path, script_name: str) -> Scoring:
    try:
        raw = score_file.read_bytes()[: 1 << 20]
        data: Any = json.loads(raw)
    except FileNotFoundError as exc:
        raise JudgeError(
            f"scoring script {script_name} wrote no verdict to $KAROTTE_SCORE_FILE"
        ) from exc
    except (OSError, ValueError) as exc:
        raise JudgeError(
            f"scoring script {script_name} wrote an unreadable verdict: {exc}"
        ) from exc
    if not isinstance(data, dict):
        raise JudgeError(f"scoring script {script_name}: verdict must be a JSON object")
    if data.get("misbehavior"):
        raise StudentMisbehaviorError(str(data["misbehavior"]))
    try:
        return Scoring(
            score=float(data["score"]),
            metadata=dict(data.get("metadata") or {}),
            continue_task=bool(data.get("continue_task", True)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise JudgeError(f"scoring script {script_name}: bad verdict {data!r}: {exc}") from exc
