#!/usr/bin/env bash
# Headless browser for the dashboard's browser tests: Debian's chromium (Playwright drives it with
# executable_path set; Playwright's own browser downloads are never used). Idempotent; run as root
# on Debian 12. The Playwright Python wheel (dev extra) ships its own Node driver, so nothing else
# is needed from outside Debian.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-browser.sh: run as root (it installs Debian packages)" >&2
    exit 1
fi

want=()
command -v chromium >/dev/null 2>&1 || want+=(chromium)
# fonts so pages (and the docs' screenshots) render text; emoji-free, small
dpkg -s fonts-dejavu-core >/dev/null 2>&1 || want+=(fonts-dejavu-core)

if [ "${#want[@]}" -gt 0 ]; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${want[@]}"
fi

chromium --version
