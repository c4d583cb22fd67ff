#!/usr/bin/env bash
# Create ./.venv (once) with torch 2.13.0 (the CPU build; never a CUDA wheel) and this
# package installed editable with its dev tools.  Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${AITER_AUX_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.aiter_aux_setup"
want="$(sha256sum pyproject.toml setup.py scripts/setup.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # torch first and pinned, so the dependency "torch>=2.11" below never pulls another build.
  # On this project's machines pip finds the 2.13.0 CPU wheel on local disk; elsewhere set
  # AITER_AUX_TORCH (e.g. "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu").
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install -q ${AITER_AUX_TORCH:-torch==2.13.0}
  fi
  "$VENV/bin/python" -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
