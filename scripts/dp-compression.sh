#!/usr/bin/env bash
# DP-FedAvg with an uplink compressor: config/digits-cnn-dp.toml (1000 clients, Poisson 0.2,
# z = 1, C = 0.5) with its updates sent dense or with SignSGD-KLMS (the [compression] table of
# config/klms-digits-signsgd.toml), with and without [privacy]; one line per run with the final
# accuracy, ε and the uplink. The noise is added by the server to the sum of the clipped
# *decoded* updates (docs/privacy.md says why that order is the sound one).
# Usage: scripts/dp-compression.sh [ROUNDS] (default: the config's 40). Needs target/release/fedshard
# (or set FEDSHARD=path).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-40}"
bin="${FEDSHARD:-target/release/fedshard}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
base=config/digits-cnn-dp.toml
klms() {
  sed 's/^deadline_ms = 120000/deadline_ms = 120000\ncompressor = "signsgd-klms"/' "$1"
  sed -n '/^\[compression\]/,$p' config/klms-digits-signsgd.toml
}
without_privacy() { sed '/^\[privacy\]/,$d' "$base"; }
cp "$base" "$work/dense-dp.toml"
without_privacy > "$work/dense.toml"
klms "$base" > "$work/signsgd-klms-dp.toml"
without_privacy > "$work/plain.toml"
klms "$work/plain.toml" > "$work/signsgd-klms.toml"
printf '%-18s %9s %9s %12s\n' run accuracy epsilon "uplink Mbit"
for name in dense-dp dense signsgd-klms-dp signsgd-klms; do
  "$bin" run "$work/$name.toml" --rounds "$rounds" --out "$work/$name" --metrics-addr off --quiet
  python3 - "$work/$name/summary.json" "$name" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
eps = (s.get("privacy") or {}).get("epsilon")
print(f"{sys.argv[2]:<18} {s['final_accuracy']:9.4f} {eps if eps is None else round(eps, 2)!s:>9} {s['uplink_bits_total'] / 1e6:12.1f}")
PY
done
