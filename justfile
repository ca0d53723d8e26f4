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

# create an environment from TEMPLATE (stacked on the templates it requires, e.g. default) in a
# temp dir against this checkout, run its lint and tests; with IMAGE=yes also build its image
# and replay the fake model in a sandbox for each of TASKS (space-separated task ids)
test-template TEMPLATE="default" IMAGE="no" TASKS="example-task":
    #!/usr/bin/env bash
    set -euo pipefail
    unset VIRTUAL_ENV
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    karotte create-env "$tmp/env" --template {{TEMPLATE}}
    cd "$tmp/env"
    uv sync --extra dev
    uv run setup_data.py
    uv run karotte check
    uv run just lint
    uv run just test
    if [ "{{IMAGE}}" = "yes" ]; then
        uv run karotte build
        for task in {{TASKS}}; do
            uv run karotte run --fake-model --task "$task" --transcript "$tmp/$task.json"
        done
    fi
