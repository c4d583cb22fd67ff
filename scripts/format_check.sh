#!/usr/bin/env bash
# Check (or with --fix, apply) clang-format on the C++/CUDA/HIP sources (.clang-format);
# generated files (stamped "generated") are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format-22}
mapfile -t files < <(git ls-files 'csrc/*.h' 'csrc/*.cpp' 'csrc/*.cu' | while read -r f; do
  head -3 "$f" | grep -qi "generated" || echo "$f"; done)
if [ "${1:-}" = "--fix" ]; then
  "$CF" -i "${files[@]}"
else
  "$CF" --dry-run -Werror "${files[@]}" || {
    echo "format_check: run bash scripts/format_check.sh --fix" >&2; exit 1; }
fi
