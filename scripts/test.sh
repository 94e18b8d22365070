#!/usr/bin/env bash
# Set-up (first run only) and the whole test suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh" test
# A real VS Code (code-server) and Chromium for the extension's end-to-end test; where they cannot
# be installed (no root for apt, no npm registry) that one test skips and says why.
bash "$root/scripts/setup-vscode-e2e.sh" || echo "kspec: the VS Code end-to-end test will skip (its set-up failed above)"
cd "$root"
exec .venv/bin/python -m pytest -q "$@"
