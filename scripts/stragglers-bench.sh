#!/usr/bin/env bash
# Sync vs over-commit vs async on the digits CNN with 30% of the clients 5x slower
# (config/stragglers/*.toml): for each mode and seed, the wall-clock seconds until the test
# accuracy first reaches 0.9 (summed record `seconds`), the accuracy after the same number of
# accepted client updates (400: 40 rounds of 10, or 80 async versions of 5), and the run's
# wall time. Usage: scripts/stragglers-bench.sh [SEEDS...] (default 1 2 3); needs a release
# build (cargo build --release) and jq. Prints one line per run, then the means.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${FEDSHARD:-${CARGO_TARGET_DIR:-target}/release/fedshard}
if [ $# -gt 0 ]; then seeds=("$@"); else seeds=(1 2 3); fi
out=$(mktemp -d)
echo "uptime: $(uptime)"
printf '%-12s %4s %14s %10s %10s %9s\n' mode seed "t(acc>=0.9) s" final_acc wall_s late
for seed in "${seeds[@]}"; do
  for mode in sync over-commit async; do
    dir="$out/$mode-$seed"
    start=$(date +%s.%N)
    "$bin" run "config/stragglers/digits-cnn-$mode.toml" --seed "$seed" --out "$dir" \
      --quiet --metrics-addr off >/dev/null 2>"$dir.log" || { echo "$mode $seed failed"; cat "$dir.log"; exit 1; }
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    jq -s --arg mode "$mode" --arg seed "$seed" --arg wall "$wall" -r '
      (reduce .[] as $r ({t: 0, hit: null}; .t += $r.seconds
         | if .hit == null and $r.accuracy >= 0.9 then .hit = .t else . end)) as $s
      | [$mode, $seed, (if $s.hit == null then "never" else ($s.hit * 10 | round / 10 | tostring) end),
         (.[-1].accuracy * 1000 | round / 1000 | tostring), ($wall | tonumber * 10 | round / 10 | tostring),
         (map(.late) | add | tostring)] | @tsv' "$dir/metrics.jsonl" \
      | awk -F'\t' '{printf "%-12s %4s %14s %10s %10s %9s\n", $1, $2, $3, $4, $5, $6}'
  done
done
echo "uptime: $(uptime)"
echo "run folders: $out"
