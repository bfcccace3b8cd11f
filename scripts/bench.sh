#!/usr/bin/env bash
# Every benchmark of the speed targets (docs/performance.md), one after the
# other in one run, each printing its same-run ratio to its peer. The tables
# go to standard output and to bench/results/<UTC date and time>.md.
# Run it on an otherwise idle machine: the figures are CPU-bound.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
mkdir -p bench/results
out="bench/results/$(date -u +%Y-%m-%dT%H%M).md"
{
  echo "# bench run $(date -u +%FT%TZ), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "commit $(git rev-parse --short HEAD)"
  $PY bench/bench_consume.py --events "${CONSUME_EVENTS:-2000}"
  $PY bench/bench_pipeline.py --events "${PIPELINE_EVENTS:-40000}"
  $PY bench/bench_middleware.py --seconds "${SECONDS_PER_CASE:-5}" --rounds "${ROUNDS:-3}"
  $PY bench/bench_api.py --seconds "${SECONDS_PER_CASE:-5}" --rounds "${ROUNDS:-3}"
  $PY bench/bench_mix.py --rounds "${ROUNDS:-3}"
} 2>&1 | tee "$out"
echo "written: $out"
