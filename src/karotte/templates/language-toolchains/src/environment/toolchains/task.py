"""`ToolchainTask`: a task with exactly one language toolchain; `ProgramOutputJudge`."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, ClassVar

from karotte.judges import Judge
from karotte.judges.base import JudgeContext, Scoring
from karotte.task import Task
from karotte.tools import Identity, student_identity, write_file_as

from environment import paths
from environment.toolchains import get_toolchain, grant
from environment.toolchains.runner import (
    make_build_dir,
    remove_build_dir,
    run_student,
)

MAX_SUBMISSION_BYTES = 1024 * 1024


class ToolchainTask(Task):
    """Set ``toolchain`` (a name in ``environment.toolchains.TOOLCHAINS``).

    Checked when the class is defined: an unknown name is an error listing the choices, a
    switched-off one (julia, mojo) an error saying why. The ``pre_hook`` grants the toolchain
    inside the image (root, before the first step); ``build`` is configured for it.
    """

    toolchain: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("toolchain")
        if name is not None:
            get_toolchain(name)  # raises ToolchainError

    @property
    def tools(self) -> list[str]:
        return ["bash", "view_lines_in_file", "replace_in_file", "build"]

    def configure_tools(self) -> dict[str, dict[str, Any]]:
        return {"build": {"toolchain": get_toolchain(self.toolchain).name}}

    def pre_hook(self) -> dict[str, Any] | None:
        toolchain = get_toolchain(self.toolchain)
        if not paths.in_image():
            # outside a container: never chmod the host's files; use what is installed
            return {"toolchain": toolchain.name, "granted": False}
        granted = grant(toolchain.name)
        return {"toolchain": toolchain.name, "granted": sorted(granted)}


def _identity(config_user: str | None) -> Identity | None:
    return student_identity(config_user) if config_user else None


class ProgramOutputJudge(Judge):
    """Compiles the submitted source (the custody copy) and runs it on hidden test cases, as
    the student, with the task's toolchain. Score: the fraction of cases whose stdout matches
    (trailing whitespace of each line ignored). ``cases`` is a JSON file (root-only, e.g. in
    root_data/) holding ``[{"stdin": "...", "stdout": "..."}, ...]``."""

    def __init__(
        self,
        toolchain: str,
        cases: Path,
        *,
        compile_timeout_s: float = 180.0,
        run_timeout_s: float = 30.0,  # generous: a JVM starts slowly on a busy machine
        limit_chars: int = 100_000,
    ) -> None:
        self.toolchain = get_toolchain(toolchain)
        self.cases = cases
        self.compile_timeout_s = compile_timeout_s
        self.run_timeout_s = run_timeout_s
        self.limit_chars = limit_chars

    @staticmethod
    def _normalise(text: str) -> str:
        return "\n".join(line.rstrip() for line in text.strip().splitlines())

    async def score(self, context: JudgeContext) -> Scoring:
        if not context.submissions:
            return Scoring(score=0.0, metadata={"error": "no submission"})
        submitted, custody = next(iter(context.submissions.items()))
        if not custody.is_file() or custody.is_symlink():
            return Scoring(score=0.0, metadata={"error": f"{submitted} was not submitted"})
        with custody.open("rb") as handle:  # root-only custody copy: read a bounded prefix
            source = handle.read(MAX_SUBMISSION_BYTES + 1)
        if len(source) > MAX_SUBMISSION_BYTES:
            return Scoring(score=0.0, metadata={"error": "submission too large"})
        cases = json.loads(self.cases.read_text(encoding="utf-8"))
        identity = _identity(context.config.student_user)
        directory = await asyncio.to_thread(make_build_dir, identity)
        try:
            return await self._score_in(directory, submitted, source, cases, identity)
        finally:
            await asyncio.to_thread(remove_build_dir, identity, directory)

    async def _score_in(
        self,
        directory: str,
        submitted: str,
        source: bytes,
        cases: list[dict[str, str]],
        identity: Identity | None,
    ) -> Scoring:
        src = os.path.join(directory, os.path.basename(submitted))
        out = os.path.join(directory, "program")
        await asyncio.to_thread(write_file_as, identity, src, source, create=True, mode=0o644)
        argv = self.toolchain.command("compile", src=src, out=out, directory=directory)
        metadata: dict[str, Any] = {"toolchain": self.toolchain.name}
        if argv is not None:
            compiled = await run_student(
                argv,
                identity=identity,
                cwd=directory,
                timeout_s=self.compile_timeout_s,
                limit_chars=4000,
                extra_env=self.toolchain.env,
            )
            if not compiled.ok:
                metadata["compile"] = f"{compiled.describe()} {compiled.output[-2000:]}"
                return Scoring(score=0.0, metadata=metadata)
        run_argv = self.toolchain.command("run", src=src, out=out, directory=directory)
        assert run_argv is not None
        passed = 0
        results = []
        for case in cases:
            ran = await run_student(
                run_argv,
                identity=identity,
                cwd=directory,
                timeout_s=self.run_timeout_s,
                limit_chars=self.limit_chars,
                stdin=case["stdin"].encode(),
                extra_env=self.toolchain.env,
            )
            ok = ran.ok and self._normalise(ran.output) == self._normalise(case["stdout"])
            passed += ok
            results.append({"ok": ok, "status": ran.describe(), "output": ran.output[:200]})
        metadata["cases"] = results
        return Scoring(score=passed / len(cases) if cases else 0.0, metadata=metadata)
