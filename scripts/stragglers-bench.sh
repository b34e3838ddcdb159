#!/usr/bin/env bash
# Sync vs over-commit vs async on the digits CNN with 30% of the clients 5x slower
# (config/stragglers/*.toml): for each mode and seed, the wall-clock seconds until the test
# accuracy first reaches 0.9 (summed record `seconds`), the accuracy after the same number of
# accepted client updates (400: 40 rounds of 10, or 80 async versions of 5), and the run's
# wall time. Usage: scripts/stragglers-bench.sh [--cluster | --virtual] [SEEDS...] (default
# 1 2 3); needs a release build (cargo build --release) and python3. Prints one line per run.
# --virtual: simulated time (`--clock virtual`, docs/async.md): the time to 0.9 is the record's
# simulated `time.end`, the same on every machine.
# --cluster: each run is a `serve` node and two `join` nodes of 10 clients each on loopback
# (the seed goes into a copy of the config, which every node reads).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${FEDSHARD:-${CARGO_TARGET_DIR:-target}/release/fedshard}
cluster=false
clock=wall
if [ "${1:-}" = "--cluster" ]; then cluster=true; shift; fi
if [ "${1:-}" = "--virtual" ]; then clock=virtual; shift; fi
if [ $# -gt 0 ]; then seeds=("$@"); else seeds=(1 2 3); fi
out=$(mktemp -d)
head -c 32 /dev/urandom | base64 >"$out/secret"
chmod 600 "$out/secret"

# One run of CONFIG with SEED into DIR, in one process or as three nodes on loopback.
run_once() {
  local config=$1 seed=$2 dir=$3
  if ! $cluster; then
    "$bin" run "$config" --seed "$seed" --out "$dir" --clock "$clock" --quiet --metrics-addr off \
      >/dev/null 2>"$dir.log"
    return
  fi
  local seeded="$dir.toml" port
  sed "s/^seed = .*/seed = $seed/" "$config" >"$seeded"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin" serve "$seeded" --listen "127.0.0.1:$port" --out "$dir" --secret-file "$out/secret" \
    --quiet --metrics-addr off >/dev/null 2>"$dir.log" &
  local server=$!
  "$bin" join "$seeded" --server "127.0.0.1:$port" --clients 0-9 --secret-file "$out/secret" \
    >/dev/null 2>"$dir.join1.log" &
  local join1=$!
  "$bin" join "$seeded" --server "127.0.0.1:$port" --clients 10-19 --secret-file "$out/secret" \
    >/dev/null 2>"$dir.join2.log" &
  local join2=$!
  wait "$server" && wait "$join1" && wait "$join2"
}
echo "uptime: $(uptime)"
printf '%-12s %4s %14s %10s %10s %9s\n' mode seed "t(acc>=0.9) s" final_acc wall_s late
for seed in "${seeds[@]}"; do
  for mode in sync over-commit async; do
    dir="$out/$mode-$seed"
    start=$(date +%s.%N)
    run_once "config/stragglers/digits-cnn-$mode.toml" "$seed" "$dir" \
      || { echo "$mode $seed failed"; cat "$dir"*.log; exit 1; }
    python3 - "$mode" "$seed" "$start" "$(date +%s.%N)" "$dir/metrics.jsonl" <<'PY'
import json, sys
mode, seed, start, end, path = sys.argv[1:]
records = [json.loads(line) for line in open(path)]
elapsed, hit = 0.0, None
for r in records:
    elapsed += r["seconds"]
    # Simulated time when the run had a clock, else the wall clock's seconds.
    at = r["time"]["end"] if r.get("time") else elapsed
    if hit is None and r["accuracy"] >= 0.9:
        hit = at
reached = "never" if hit is None else f"{hit:.1f}"
late = sum(r["late"] for r in records)
wall = float(end) - float(start)
print(f"{mode:<12} {seed:>4} {reached:>14} {records[-1]['accuracy']:>10.3f} {wall:>10.1f} {late:>9}")
PY
  done
done
echo "uptime: $(uptime)"
echo "run folders: $out"
