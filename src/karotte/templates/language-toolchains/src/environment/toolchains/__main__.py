"""`python -m environment.toolchains COMMAND`, as root. Commands:

* `lock`: take every toolchain away from the student (the image build does it with
  `components.py lock` in the package layer); `check-locked` (the image build's last steps)
  fails if any toolchain path is still open to others.
* `probe`: which toolchains the student can use right now (compile and run a program).
* `selftest NAME` (inside a fresh container of the image, as root): does what a task with
  toolchain NAME does before its first step (the grant), then, as the student, builds and runs
  the scripted good solution with the `build` tool's code, grades the good and the wrong
  solution with the task's judge, and tries every toolchain's compiler on its own solution.
  Prints one JSON object; the repository's tests assert on it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from environment.toolchains import (
    COMPONENTS,
    TOOLCHAINS,
    get_toolchain,
    grant,
    lock,
    resolve_component,
    unlocked,
)


async def _probes(identity: Any) -> dict[str, Any]:
    """Every toolchain's compiler (or loader) on its own good solution, as the student."""
    from environment.tasks.sum_of_squares.task import solution, source_path
    from environment.toolchains.runner import compile_and_run

    reachable: dict[str, Any] = {}
    for other in TOOLCHAINS.values():
        tried, _ = await compile_and_run(
            other,
            source_path(other.name).name,
            solution("good", other.name).encode(),
            identity=identity,
            stdin=b"3\n",
            compile_timeout_s=180,
            run_timeout_s=20,
            limit_chars=2000,
        )
        step = tried.compiled if not tried.compile_ok else tried.ran
        reachable[other.name] = {
            "works": bool(tried.ran and tried.ran.ok and tried.ran.output.strip() == "14"),
            "output": step.output[-300:] if step else "",
        }
    return reachable


# Back ends and runtimes, tried directly as the student (exit code 0 = usable).
COMMANDS = {
    "as": ["as", "--version"],
    "ld": ["ld", "--version"],
    "jdk-java": ["/usr/lib/jvm/java-17-openjdk-amd64/bin/java", "-version"],
    "javac-module": [
        "/usr/lib/jvm/java-17-openjdk-amd64/bin/java",
        "-m",
        "jdk.compiler/com.sun.tools.javac.Main",
        "-version",
    ],
    "javac-module-clojure-jre": [
        "/opt/clojure-jre/bin/java",
        "-m",
        "jdk.compiler/com.sun.tools.javac.Main",
        "-version",
    ],
}


async def _commands(identity: Any) -> dict[str, int | None]:
    from environment.toolchains.runner import run_student

    codes: dict[str, int | None] = {}
    for name, argv in COMMANDS.items():
        done = await run_student(argv, identity=identity, cwd="/", timeout_s=60, limit_chars=1000)
        codes[name] = done.exit_code
    return codes


async def _selftest(name: str) -> dict[str, Any]:
    from karotte.config import EvaluationRunConfig
    from karotte.judges.base import JudgeContext
    from karotte.tools import student_identity

    from environment.tasks.sum_of_squares.task import CASES, solution, source_path
    from environment.toolchains.runner import compile_and_run
    from environment.toolchains.task import ProgramOutputJudge

    toolchain = get_toolchain(name)
    report: dict[str, Any] = {"toolchain": name, "granted": sorted(grant(name))}
    identity = student_identity("student")
    started = time.monotonic()
    built, _ = await compile_and_run(
        toolchain,
        source_path(name).name,
        solution("good", name).encode(),
        identity=identity,
        stdin=b"3\n",
        compile_timeout_s=180,
        run_timeout_s=20,
        limit_chars=4000,
    )
    report["build"] = {
        "compile_ok": built.compile_ok,
        "compile_output": built.compiled.output if built.compiled else None,
        "run_exit": built.ran.exit_code if built.ran else None,
        "run_output": built.ran.output if built.ran else None,
        "seconds": round(time.monotonic() - started, 2),
    }
    config = EvaluationRunConfig(task_id=f"sum-of-squares-{name}", student_user="student")
    judge = ProgramOutputJudge(name, CASES)
    for kind in ("good", "wrong"):
        custody = source_path(name).parent / f".custody-{kind}"
        custody.parent.mkdir(parents=True, exist_ok=True)
        custody.write_text(solution(kind, name), encoding="utf-8")
        context = JudgeContext(
            config=config,
            step_index=0,
            messages=[],
            submissions={str(source_path(name)): custody},
        )
        started = time.monotonic()
        scoring = await judge.score(context)
        custody.unlink()
        report[f"score_{kind}"] = scoring.score
        report[f"score_{kind}_metadata"] = scoring.metadata
        report[f"score_{kind}_seconds"] = round(time.monotonic() - started, 2)
    report["probes"] = await _probes(identity)
    report["commands"] = await _commands(identity)
    return report


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"lock", "check-locked", "grant", "list", "probe", "selftest"}:
        print(__doc__, file=sys.stderr)
        return 2
    command = argv[0]
    if command == "list":
        for toolchain in TOOLCHAINS.values():
            print(f"{toolchain.name:12} {toolchain.title}  [{', '.join(toolchain.components)}]")
        return 0
    if command == "probe":
        from karotte.tools import student_identity

        print(json.dumps(asyncio.run(_probes(student_identity("student")))))
        return 0
    if command == "check-locked":
        still_open = unlocked()
        for path in still_open:
            print(f"not locked: {path}", file=sys.stderr)
        if still_open:
            return 1
        count = sum(len(resolve_component(component)) for component in COMPONENTS)
        print(f"every toolchain is locked ({count} paths)")
        return 0
    if command == "lock":
        done = lock()
        for component, found in done.items():
            print(f"locked {component}: {' '.join(found)}")
        return 0
    if len(argv) != 2:
        print(f"usage: python -m environment.toolchains {command} NAME", file=sys.stderr)
        return 2
    if command == "grant":
        print(json.dumps(grant(argv[1]), indent=2))
        return 0
    print(json.dumps(asyncio.run(_selftest(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
