#!/usr/bin/env bash
# Set up (if needed) and run the tests.
#   bash scripts/test.sh          the fast tier: every test but those marked slow (the GPU
#                                 kernels' fiber emulator), wheel (a prebuilt wheel in a
#                                 fresh venv) or robust (build races, kills, odd paths: one
#                                 smoke of each file stays); GPU tests skip without a GPU
#   bash scripts/test.sh --all    every test (what CI runs)
# Other arguments go to pytest (e.g. -q, -x, -k catalog).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=(-m "not slow and not wheel and not robust")
args=()
for a in "$@"; do
  if [ "$a" = "--all" ]; then tier=(); else args+=("$a"); fi
done
[ -x "${AITER_AUX_VENV:-.venv}/bin/python" ] || echo "test.sh: first run: creating ${AITER_AUX_VENV:-.venv} (about a minute)"
bash scripts/setup.sh
. "${AITER_AUX_VENV:-.venv}/bin/activate"
python -m pytest op_tests ${tier[@]+"${tier[@]}"} ${args[@]+"${args[@]}"}
