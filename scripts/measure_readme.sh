#!/usr/bin/env bash
# Measure the figures the README quotes, the way a new user meets them: a fresh clone of
# HEAD in a temporary directory, its own venv and an empty build cache.  Prints each figure
# with the machine (cores, CPU) and its load (1-minute load average before and after), in
# the form the README uses.  Nothing outside the temporary directory is written.
#
#   bash scripts/measure_readme.sh          set-up, main job, cold / no-op build, fast tier
#   bash scripts/measure_readme.sh --all    also the whole suite (scripts/test.sh --all)
#
# Takes ~5 minutes on 2 cores (~10 with --all); run it on a quiet machine: the figures
# scale with the load it reports.
set -euo pipefail
cd "$(dirname "$0")/.."
ALL=${1:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.${3:-0}f}')"; }

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
echo "machine: $(nproc) cores ($cpu), $(uname -sm); HEAD $(git rev-parse --short HEAD)"
echo "load average (1 min) at start: $(load)"
git clone -q . "$TMP/clone"
cd "$TMP/clone"
export AITER_AUX_CACHE_DIR="$TMP/cache"
unset AITER_AUX_SOURCE_DIR AITER_AUX_REBUILD AITER_AUX_DISABLE_JIT MAX_JOBS

t0=$(now)
bash scripts/setup.sh >/dev/null
t1=$(now)
bash scripts/main.sh >"$TMP/main.log" 2>&1
t2=$(now)
cold=$(grep -m1 'wall time' "$TMP/main.log" | awk '{print $4}')
# shellcheck disable=SC1091
. .venv/bin/activate
t=$(now)
aiter-aux build >/dev/null 2>&1
noop=$(secs "$t" "$(now)" 1)
echo "set-up (fresh venv): $(secs "$t0" "$t1") s"
echo "main job from scratch (set-up + scripts/main.sh): $(secs "$t0" "$t2") s" \
  "(cold build of the catalog: $cold s; $(grep -c 'outputs match the reference' "$TMP/main.log") of $(grep -c "^aiter-aux run" scripts/main.sh) runs all matching)"
echo "no-op build (a second aiter-aux build, whole process): $noop s"
echo "load average (1 min) after the main job: $(load)"

t3=$(now)
bash scripts/test.sh -q -p no:cacheprovider >"$TMP/tests.log" 2>&1 || true
t4=$(now)
echo "fast tier (scripts/test.sh): $(secs "$t3" "$t4") s: $(tail -1 "$TMP/tests.log" | tr -d '=')"
if [ "$ALL" = "--all" ]; then
  t5=$(now)
  bash scripts/test.sh --all -q -p no:cacheprovider >"$TMP/tests_all.log" 2>&1 || true
  t6=$(now)
  echo "whole suite (scripts/test.sh --all): $(secs "$t5" "$t6") s:" \
    "$(tail -1 "$TMP/tests_all.log" | tr -d '=')"
fi
echo "load average (1 min) at the end: $(load)"
