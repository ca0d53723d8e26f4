"""Language toolchains: exactly one per task, from Debian bookworm packages.

Every toolchain's entry points and library directories ("components") are locked at image
build time (`components.py lock`, in the package layer: root-owned, no access for others). A task
names its toolchain (`ToolchainTask.toolchain`); its `pre_hook` grants that toolchain's
components (read and execute for others) before the first step. So in a C task `javac`, `ghc`,
`go`... fail for the student with "Permission denied", from bash and from the `build` tool.

Shared back ends: several front ends drive GCC's driver, `as` and `ld` to assemble and link
(component `linker`); GnuCOBOL translates to C and GHC compiles a small C stub into every
program, so both need GCC's C compiler proper (component `c-compiler`, so C is reachable in
their tasks). The exact grants are in `TOOLCHAINS` and in TOOLCHAINS.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from karotte.errors import TaskDefinitionError

from environment.toolchains.components import (
    COMPONENTS,
    grant_components,
    lock,
    resolve_component,
    unlocked,
)

__all__ = [
    "COMPONENTS",
    "DISABLED",
    "TOOLCHAINS",
    "Toolchain",
    "ToolchainError",
    "get_toolchain",
    "grant",
    "lock",
    "resolve_component",
    "unlocked",
]


class ToolchainError(TaskDefinitionError):
    """A task names a toolchain that does not exist or is switched off."""


@dataclass(frozen=True)
class Toolchain:
    """One language toolchain. Commands are argv templates: {src} (the source file), {out}
    (the executable to produce), {dir} (the build directory), {stem} (source name without
    its suffix)."""

    name: str
    title: str
    packages: tuple[str, ...]
    components: tuple[str, ...]
    extension: str
    compile: tuple[str, ...] | None
    run: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)

    def command(self, which: str, *, src: str, out: str, directory: str) -> list[str] | None:
        template = self.compile if which == "compile" else self.run
        if template is None:
            return None
        stem = Path(src).stem
        return [part.format(src=src, out=out, dir=directory, stem=stem) for part in template]


TOOLCHAINS: dict[str, Toolchain] = {
    t.name: t
    for t in (
        Toolchain(
            "c",
            "C (GCC 12)",
            ("gcc", "libc6-dev"),
            ("c-compiler", "linker"),
            ".c",
            ("gcc", "-O2", "-Wall", "-std=gnu17", "-o", "{out}", "{src}", "-lm"),
            ("{out}",),
        ),
        Toolchain(
            "cpp",
            "C++ (G++ 12)",
            ("g++",),
            ("cxx-compiler", "linker"),
            ".cpp",
            ("g++", "-O2", "-Wall", "-std=gnu++17", "-o", "{out}", "{src}"),
            ("{out}",),
        ),
        Toolchain(
            "cobol",
            "COBOL (GnuCOBOL 3.1, free format)",
            ("gnucobol",),
            ("gnucobol", "c-compiler", "linker"),
            ".cob",
            ("cobc", "-x", "-free", "-o", "{out}", "{src}"),
            ("{out}",),
        ),
        Toolchain(
            "prolog",
            "Prolog (GNU Prolog 1.5)",
            ("gprolog",),
            ("gprolog", "linker"),
            ".pl",
            ("gplc", "--no-top-level", "-o", "{out}", "{src}"),
            ("{out}",),
        ),
        Toolchain(
            "pascal",
            "Pascal (Free Pascal 3.2)",
            ("fp-compiler", "fp-units-rtl"),
            ("fpc", "linker"),
            ".pas",
            ("fpc", "-O2", "-o{out}", "{src}"),
            ("{out}",),
        ),
        Toolchain(
            "java",
            "Java (OpenJDK 17)",
            ("openjdk-17-jdk-headless",),
            ("jvm", "jdk-tools"),
            ".java",
            ("javac", "-d", "{dir}", "{src}"),
            ("java", "-cp", "{dir}", "{stem}"),
        ),
        Toolchain(
            "clojure",
            "Clojure 1.11 (on OpenJDK 17)",
            ("clojure",),
            ("clojure-jre", "clojure"),
            ".clj",
            None,
            # the launcher on /opt/clojure-jre (Debian's /usr/bin/clojure runs the JDK's java)
            ("/usr/local/bin/clojure", "{src}"),
        ),
        Toolchain(
            "go",
            "Go 1.19",
            ("golang-go",),
            ("go",),
            ".go",
            ("go", "build", "-o", "{out}", "{src}"),
            ("{out}",),
            {"CGO_ENABLED": "0", "GO111MODULE": "off"},
        ),
        Toolchain(
            "rust",
            "Rust 1.63 (rustc)",
            ("rustc",),
            ("rust", "linker"),
            ".rs",
            ("rustc", "--edition", "2021", "-O", "-o", "{out}", "{src}"),
            ("{out}",),
        ),
        Toolchain(
            "haskell",
            "Haskell (GHC 9.0)",
            ("ghc",),
            ("ghc", "c-compiler", "linker"),
            ".hs",
            ("ghc", "-O0", "-outputdir", "{dir}/obj", "-o", "{out}", "{src}"),
            ("{out}",),
        ),
        Toolchain(
            "ocaml",
            "OCaml 4.13 (ocamlopt)",
            ("ocaml-nox",),
            ("ocaml", "linker"),
            ".ml",
            ("ocamlopt", "-o", "{out}", "{src}"),
            ("{out}",),
        ),
        Toolchain(
            "common-lisp",
            "Common Lisp (SBCL 2.2)",
            ("sbcl",),
            ("sbcl",),
            ".lisp",
            None,
            ("sbcl", "--script", "{src}"),
        ),
    )
}

DISABLED: dict[str, str] = {
    "julia": (
        "Julia is off: it is not in the package registries reachable here (Debian bookworm "
        "has no julia package, and the image installs toolchains only from Debian)"
    ),
    "mojo": (
        "Mojo is off: its license is proprietary (Modular's community license, not an open "
        "source license) and there is no Debian package"
    ),
}


def get_toolchain(name: str) -> Toolchain:
    """The toolchain called ``name``; a clear error for an unknown or switched-off one."""
    if name in TOOLCHAINS:
        return TOOLCHAINS[name]
    if name in DISABLED:
        raise ToolchainError(f"toolchain {name!r} is not available: {DISABLED[name]}")
    raise ToolchainError(
        f"unknown toolchain {name!r}; choose one of: {', '.join(TOOLCHAINS)} "
        f"(switched off: {', '.join(DISABLED)})"
    )


def grant(name: str) -> dict[str, list[str]]:
    """Give the student (others) read and execute on ``name``'s components (as root)."""
    return grant_components(get_toolchain(name).components)


def installed(name: str) -> bool:
    """Whether ``name``'s components exist on this machine."""
    toolchain = get_toolchain(name)
    try:
        for component in toolchain.components:
            resolve_component(component)
    except FileNotFoundError:
        return False
    return True
