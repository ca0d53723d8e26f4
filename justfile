# Karotte developer tasks. Run with `uv run --extra dev just <recipe>`.

# ruff format --check, ruff check, mypy (strict)
lint:
    ruff format --check src tests bench
    ruff check src tests bench
    mypy

# format and auto-fix
fix:
    ruff format src tests bench
    ruff check --fix src tests bench

# the whole test suite (tests needing root/docker/podman/gVisor skip, with the reason, where absent)
test *ARGS:
    pytest {{ARGS}}

# only the fast tests (no image builds, no sandboxes)
test-fast *ARGS:
    pytest -m "not slow" {{ARGS}}
