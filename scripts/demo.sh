#!/usr/bin/env bash
# Set-up (first run only) and the main job: k alternatives at a cursor in the bundled example.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
exec "$root/.venv/bin/kspec" complete "$root/examples/demo.py:16:5" -k 4 "$@"
