#!/usr/bin/env bash
# Node.js and npm for the CLI agent tests (tests/cli_agents): the tests install the pinned
# Claude Code and Codex packages from the npm registry themselves, once, into
# $KAROTTE_TEST_CLI_AGENTS_DIR (default /var/tmp/karotte-test-cli-agents), with the adapters'
# own install commands. Debian 12's nodejs is 18.x: enough (Claude Code ships a native binary,
# Codex's launcher needs node >= 16). Idempotent; run as root on Debian 12.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-cli-agents.sh: run as root (it installs Debian packages)" >&2
    exit 1
fi

want=()
command -v node >/dev/null 2>&1 || want+=(nodejs)
command -v npm >/dev/null 2>&1 || want+=(npm)

if [ "${#want[@]}" -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${want[@]}"
fi

echo "node $(node --version), npm $(npm --version)"
