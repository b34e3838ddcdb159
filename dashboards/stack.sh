#!/usr/bin/env bash
# Prometheus and Grafana for watching `fedshard run`, in the foreground; Ctrl-C stops both.
#
#   dashboards/stack.sh            # Prometheus on 127.0.0.1:9090, Grafana on 127.0.0.1:3000
#
# Prometheus reads dashboards/prometheus.yml (scrapes 127.0.0.1:9464 every second); Grafana reads
# its provisioning from dashboards/provisioning: the data source (uid `prometheus`, the
# Prometheus above) and the dashboard provider (dashboards/fedshard.json, folder "fedshard").
# Anonymous access is on (a local stack); data and logs go to a temp folder.
# Needs `prometheus` and Grafana (`grafana` or `grafana-server` on PATH, home in $GRAFANA_HOME,
# default /usr/share/grafana). Without Grafana, Prometheus's own graph page still works.
set -euo pipefail
dashboards="$(cd "$(dirname "$0")" && pwd)"
state="${FEDSHARD_STACK_DIR:-${TMPDIR:-/tmp}/fedshard-stack}"
grafana_home="${GRAFANA_HOME:-/usr/share/grafana}"
mkdir -p "$state"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait' EXIT INT TERM

command -v prometheus >/dev/null || { echo "error: prometheus is not on PATH (Debian: apt-get install prometheus)" >&2; exit 1; }
prometheus --config.file="$dashboards/prometheus.yml" --storage.tsdb.path="$state/prometheus" \
  --web.listen-address=127.0.0.1:9090 >"$state/prometheus.log" 2>&1 &
pids+=($!)
echo "prometheus: http://127.0.0.1:9090/graph (log: $state/prometheus.log)"

if command -v grafana >/dev/null; then
  grafana=(grafana server)
elif command -v grafana-server >/dev/null; then
  grafana=(grafana-server)
else
  echo "grafana: not on PATH (https://grafana.com/docs/grafana/latest/setup-grafana/installation/);" \
    "Prometheus alone is running" >&2
  grafana=()
fi
if [ ${#grafana[@]} -gt 0 ]; then
  FEDSHARD_DASHBOARDS="$dashboards" \
  GF_PATHS_PROVISIONING="$dashboards/provisioning" \
  GF_PATHS_DATA="$state/grafana" GF_PATHS_LOGS="$state/grafana/log" \
  GF_SERVER_HTTP_ADDR=127.0.0.1 GF_SERVER_HTTP_PORT=3000 \
  GF_AUTH_ANONYMOUS_ENABLED=true GF_AUTH_ANONYMOUS_ORG_ROLE=Admin \
    "${grafana[@]}" --homepath "$grafana_home" >"$state/grafana.log" 2>&1 &
  pids+=($!)
  echo "grafana:    http://127.0.0.1:3000/d/fedshard (log: $state/grafana.log)"
fi
echo "now start a run, e.g. cargo run --release -- run config/digits-linear.toml --linger 10"
wait -n "${pids[@]}"
