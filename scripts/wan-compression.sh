#!/usr/bin/env bash
# Uplink compression over real, rate-limited links (docs/cluster.md): for each compressor, the
# dense MNIST CNN of config/simulated/mnist-cnn-10mbit.toml on the wall clock (its [devices] and
# [network] tables dropped: the links are real here) as a `cargo xtask wan` federation of 10
# client hosts with 10 Mbit/s uplinks and a 100 Mbit/s server link, one client per host. Prints
# per compressor the mean round, the time to the target accuracy (summed round seconds), the
# final accuracy, the bytes the uplinks carried and whether the model equals the in-process one.
# Usage: scripts/wan-compression.sh [TARGET] [COMPRESSORS...] (default 0.8, identity qsgd-elias
# signsgd signsgd-klms); needs root, iproute2, python3 and `fedshard data mnist` once.
# BASE=CONFIG replaces the base config (e.g. config/klms-mnist-fedpm-cnn.toml for fedpm and
# fedpm-klms), ROUNDS=N its rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-0.8}
shift || true
if [ $# -gt 0 ]; then compressors=("$@"); else compressors=(identity qsgd-elias signsgd signsgd-klms); fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cargo build --quiet --release --bin fedshard
echo "uptime: $(uptime)"
printf '%-14s %9s %14s %9s %14s %6s\n' compressor s/round "t(acc>=$target) s" final_acc uplink_MB equal
for compressor in "${compressors[@]}"; do
  config="$out/$compressor.toml"
  # The wall clock, this compressor; identity takes no [compression] table.
  sed -e '/^clock = /d' -e '/^\[devices\]/,$d' \
    -e "s/^compressor = .*/compressor = \"$compressor\"/" "${BASE:-config/simulated/mnist-cnn-10mbit.toml}" >"$config"
  if [ "$compressor" = identity ]; then
    sed -i '/^\[compression\]/,/^$/d; /^# The compressors.*/,/^# `identity`)/d' "$config"
  fi
  cargo xtask wan --nodes 10 --uplink-mbit 10 --server-mbit 100 --config "$config" \
    ${ROUNDS:+--rounds "$ROUNDS"} --bin target/release/fedshard --json >"$out/$compressor.jsonl"
  python3 - "$compressor" "$target" "$out/$compressor.jsonl" <<'PY'
import json, sys
compressor, target, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
lines = [json.loads(l) for l in open(path) if l.strip()]
rounds = [l for l in lines if "round" in l]
last = lines[-1]
elapsed, hit = 0.0, None
for r in rounds:
    elapsed += r["seconds"]
    if hit is None and r["accuracy"] >= target:
        hit = elapsed
reached = "never" if hit is None else f"{hit:.1f}"
print(f"{compressor:<14} {elapsed / len(rounds):>9.2f} {reached:>14} {rounds[-1]['accuracy']:>9.3f} "
      f"{last['wire_up_bytes'] / 1e6:>14.1f} {str(last['equal']):>6}")
PY
done
