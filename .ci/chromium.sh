#!/usr/bin/env bash
# Debian's chromium, for the headless-browser test of the HTML report (tests/test_report.py).
# Idempotent: does nothing when a chromium binary is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null
