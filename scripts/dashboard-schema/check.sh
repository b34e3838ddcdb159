#!/usr/bin/env bash
# Checks Grafana dashboards and provisioning files against Grafana's published schema (npm
# `@grafana/schema`, compiled with `typescript`) and checks their data-source and variable
# references; see check.mjs for what exactly fails.
#
#   scripts/dashboard-schema/check.sh [--install] [--provisioning DIR] [DASHBOARD.json...]
#
# Defaults: every dashboards/*.json and dashboards/provisioning. `--install` only installs.
# The pinned packages (package.json + package-lock.json) are installed with `npm ci` into
# $FEDSHARD_DASHBOARD_SCHEMA_CACHE (default: target/tmp/dashboard-schema, which tests/dashboards.rs
# uses too; ignored by git) and reinstalled only when the lock file changes. Needs node >= 18 and
# npm (and the npm registry, the first time).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${FEDSHARD_DASHBOARD_SCHEMA_CACHE:-$repo/target/tmp/dashboard-schema}"

install_hint="install Node.js >= 18 with npm (Debian/Ubuntu: \`apt-get install nodejs npm\`; \
elsewhere https://nodejs.org/en/download), then rerun"
for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "error: \`$tool\` is not on PATH; the dashboard schema check needs it: $install_hint" >&2
    exit 3
  fi
done
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; then
  echo "error: node $(node --version) is too old for the dashboard schema check: $install_hint" >&2
  exit 3
fi

install_only=false
provisioning="$repo/dashboards/provisioning"
dashboards=()
while [ $# -gt 0 ]; do
  case "$1" in
    --install) install_only=true ;;
    --provisioning) provisioning="$2"; shift ;;
    -*) echo "error: unknown option $1" >&2; exit 2 ;;
    *) dashboards+=("$1") ;;
  esac
  shift
done
if [ ${#dashboards[@]} -eq 0 ]; then
  dashboards=("$repo"/dashboards/*.json)
fi

# Install once per lock file; `flock` (util-linux) keeps concurrent callers from racing.
mkdir -p "$cache"
install() {
  local stamp="$cache/installed.sha256"
  local want
  want="$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$cache/node_modules" ]; then
    return
  fi
  cp "$here/package.json" "$here/package-lock.json" "$cache/"
  echo "installing @grafana/schema and typescript into $cache (npm ci)" >&2
  if ! (cd "$cache" && npm ci --no-audit --no-fund --loglevel=error >&2); then
    echo "error: \`npm ci\` failed in $cache: is the npm registry reachable?" >&2
    exit 3
  fi
  echo "$want" >"$stamp"
}
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache/install.lock"
  flock 9
  install
  flock -u 9
else
  install
fi

if $install_only; then
  exit 0
fi
exec node "$here/check.mjs" --cache "$cache" --provisioning "$provisioning" "${dashboards[@]}"
