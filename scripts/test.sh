#!/usr/bin/env bash
# Set up (if needed) and run the tests.
#   bash scripts/test.sh          the fast tier: every test but those marked slow (the GPU
#                                 kernels' fiber emulator), wheel (a prebuilt wheel in a
#                                 fresh venv) or robust (build races, kills, odd paths: one
#                                 smoke of each file stays); GPU tests skip without a GPU
#   bash scripts/test.sh --all    every test (what CI runs)
#   bash scripts/test.sh FILE[::TEST] ...
#                                 only those files or tests (their fast-tier tests; with
#                                 --all every tier of them)
# Other arguments go to pytest (e.g. -q, -x, -k catalog).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=(-m "not slow and not wheel and not robust")
args=()
where=(op_tests)
for a in "$@"; do
  if [ "$a" = "--all" ]; then
    tier=()
  else
    args+=("$a")
    # a file, directory or node id (FILE::TEST) names what to run instead of op_tests
    if [ "${a#-}" = "$a" ] && [ -e "${a%%::*}" ]; then where=(); fi
  fi
done
[ -x "${AITER_AUX_VENV:-.venv}/bin/python" ] || echo "test.sh: first run: creating ${AITER_AUX_VENV:-.venv} (about a minute)"
bash scripts/setup.sh
. "${AITER_AUX_VENV:-.venv}/bin/activate"
python -m pytest ${where[@]+"${where[@]}"} ${tier[@]+"${tier[@]}"} ${args[@]+"${args[@]}"}
