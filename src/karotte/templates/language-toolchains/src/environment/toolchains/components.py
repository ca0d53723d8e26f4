"""Which paths make up each toolchain, and locking them (standard library only).

The image build runs this file as a script right after installing the packages, in the same
layer (`python3 components.py lock`): locking in a later layer would copy every locked file
into that layer (hundreds of MB). `environment.toolchains` imports it for the grants.
"""

from __future__ import annotations

import glob
import os
import stat
import sys

GCC = "/usr/lib/gcc/x86_64-linux-gnu/12"
JDK = "/usr/lib/jvm/java-17-openjdk-amd64"

# Component -> path globs. Each glob must match at build time (a package change is noticed).
# Symlinks are resolved: the real file or directory is locked. A locked directory cannot be
# entered, so everything below it is unreachable.
COMPONENTS: dict[str, tuple[str, ...]] = {
    # GCC's C compiler proper (also the preprocessor: `cpp` and `gcc -E` run cc1 -E)
    "c-compiler": (f"{GCC}/cc1",),
    # GCC's C++ compiler proper
    "cxx-compiler": (f"{GCC}/cc1plus",),
    # the GCC drivers (used to assemble and link), collect2, the link-time optimiser, the
    # assembler and the linkers: no compiler of a language by themselves
    "linker": (
        f"{GCC}/lto1",
        "/usr/bin/x86_64-linux-gnu-gcc-12",
        "/usr/bin/x86_64-linux-gnu-g++-12",
        "/usr/bin/x86_64-linux-gnu-cpp-12",
        f"{GCC}/collect2",
        f"{GCC}/lto-wrapper",
        "/usr/bin/x86_64-linux-gnu-as",
        "/usr/bin/x86_64-linux-gnu-ld.bfd",
        "/usr/bin/x86_64-linux-gnu-ld.gold",
    ),
    "gnucobol": (
        "/usr/bin/cobc",
        "/usr/bin/cobcrun",
        "/usr/share/gnucobol",
        "/usr/lib/x86_64-linux-gnu/libcob.so.4.*",
    ),
    "gprolog": ("/usr/lib/gprolog",),
    "fpc": ("/usr/lib/x86_64-linux-gnu/fpc", "/usr/bin/x86_64-linux-gnu-fpc-3.2.2"),
    # the JVM (the whole JDK directory)
    "jvm": (JDK,),
    # the JDK's tool launchers; `java` itself stays in `jvm`
    "jdk-tools": (
        f"{JDK}/bin/jar",
        f"{JDK}/bin/jarsigner",
        f"{JDK}/bin/javac",
        f"{JDK}/bin/javadoc",
        f"{JDK}/bin/javap",
        f"{JDK}/bin/jcmd",
        f"{JDK}/bin/jdb",
        f"{JDK}/bin/jdeprscan",
        f"{JDK}/bin/jdeps",
        f"{JDK}/bin/jfr",
        f"{JDK}/bin/jhsdb",
        f"{JDK}/bin/jimage",
        f"{JDK}/bin/jinfo",
        f"{JDK}/bin/jlink",
        f"{JDK}/bin/jmap",
        f"{JDK}/bin/jmod",
        f"{JDK}/bin/jpackage",
        f"{JDK}/bin/jps",
        f"{JDK}/bin/jrunscript",
        f"{JDK}/bin/jshell",
        f"{JDK}/bin/jstack",
        f"{JDK}/bin/jstat",
        f"{JDK}/bin/jstatd",
        f"{JDK}/bin/serialver",
    ),
    # a Java runtime without the Java compiler, linked at build for Clojure (see Containerfile)
    "clojure-jre": ("/opt/clojure-jre",),
    "clojure": (
        "/usr/local/bin/clojure",
        "/usr/share/java/clojure-1.11.1.jar",
        "/usr/share/java/spec.alpha-*.jar",
        "/usr/share/java/core.specs.alpha-*.jar",
    ),
    "go": ("/usr/lib/go-1.19",),
    "rust": (
        "/usr/bin/rustc",
        "/usr/bin/rustdoc",
        "/usr/lib/rustlib",
        "/usr/lib/x86_64-linux-gnu/librustc_driver-*.so",
    ),
    "ghc": ("/usr/lib/ghc",),
    "ocaml": ("/usr/lib/ocaml", "/usr/bin/ocaml*"),
    "sbcl": ("/usr/lib/sbcl", "/usr/bin/sbcl"),
}


def resolve_component(component: str, *, strict: bool = True) -> list[str]:
    """The real paths a component's globs match (symlinks resolved), sorted and unique."""
    found: set[str] = set()
    for pattern in COMPONENTS[component]:
        matches = glob.glob(pattern)
        if not matches and strict:
            raise FileNotFoundError(f"component {component!r}: nothing matches {pattern}")
        found.update(os.path.realpath(match) for match in matches)
    return sorted(found)


def _chmod_other(path: str, *, allow: bool) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return
    if info.st_uid != 0:
        raise PermissionError(f"{path} is not owned by root (uid {info.st_uid})")
    mode = stat.S_IMODE(info.st_mode)
    if allow:
        # others get what the owner may read and execute (never write)
        owner = (mode >> 6) & 0o5
        new = (mode & ~0o007) | owner
    else:
        new = mode & ~0o007
    if info.st_gid != 0:  # the student must not reach it through a group either
        os.chown(path, 0, 0, follow_symlinks=False)
    if new != mode or info.st_gid != 0:
        os.chmod(path, new)


def lock(components: list[str] | None = None) -> dict[str, list[str]]:
    """Take every component's paths away from everyone but root (at image build)."""
    done: dict[str, list[str]] = {}
    for component in components or list(COMPONENTS):
        paths = resolve_component(component)
        for path in paths:
            _chmod_other(path, allow=False)
        done[component] = paths
    return done


def grant_components(components: list[str] | tuple[str, ...]) -> dict[str, list[str]]:
    """Give others (the student) read and execute on ``components`` (as root)."""
    done: dict[str, list[str]] = {}
    for component in components:
        paths = resolve_component(component)
        for path in paths:
            _chmod_other(path, allow=True)
        done[component] = paths
    return done


def unlocked(components: list[str] | None = None) -> list[str]:
    """Paths of ``components`` that others can still read, write or execute."""
    return [
        path
        for component in components or list(COMPONENTS)
        for path in resolve_component(component)
        if os.lstat(path).st_mode & 0o007
    ]


if __name__ == "__main__":
    if sys.argv[1:] != ["lock"]:
        sys.exit("usage: python3 components.py lock")
    for component, found in lock().items():
        print(f"locked {component}: {' '.join(found)}")
