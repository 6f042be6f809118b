#!/usr/bin/env bash
# Services the test suite uses, from Debian's packages, idempotent:
#   PostgreSQL: a throwaway cluster (trust auth, unix socket only) under
#               $SERVETUNE_SERVICES_DIR (default ./.cache/services); reused when running.
#   chromium:   headless browser for the report tests (and kaleido's PNG/SVG export).
#   prometheus: installed by `all`; `prometheus CONFIG` (re)starts a Prometheus server with CONFIG on
#               127.0.0.1:$SERVETUNE_PROM_PORT (default 59090), data under $DIR/prometheus;
#               prints SERVETUNE_PROM_URL=... (the monitor tests load generated rules into it).
# Usage: scripts/services.sh [all|pg|chromium|prometheus [CONFIG]|prometheus-stop|stop|url]   (default: all)
# Prints SERVETUNE_PG_URL=... and writes it to $DIR/pg.env for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
DIR="${SERVETUNE_SERVICES_DIR:-$ROOT/.cache/services}"
PORT="${SERVETUNE_PG_PORT:-55432}"

log() { echo "services: $*" >&2; }
# A missing prerequisite is one line on stderr and exit 2, like servetune's own errors.
die() {
  echo "error: $*" >&2
  exit 2
}

# apt_install TOOL PACKAGE...: install what provides TOOL, as root or through sudo.
apt_install() {
  local tool="$1" sudo=""
  shift
  if ! command -v apt-get >/dev/null 2>&1; then
    die "$tool not found, and this system has no apt-get: install $* with its package manager"
  fi
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo="sudo -n"
    else
      die "$tool not found: sudo apt-get install -y $* (needs root or sudo)"
    fi
  fi
  log "installing $* (apt-get)"
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' 2>/dev/null | head -1)" ]; then
    $sudo apt-get update -q >&2
  fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2 || {
    $sudo apt-get update -q >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2
  }
}

pg_bin() {
  local d
  d="$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -1)"
  [ -n "$d" ] && [ -x "$d/pg_ctl" ] && echo "$d"
}

# Postgres refuses to run as root: as root, the cluster belongs to the `postgres` user,
# so its folder must be reachable by that user (else a /var/tmp folder is used).
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# A unix socket path must stay under ~107 bytes: deep checkouts use /var/tmp too.
pg_dir() {
  local d="$DIR/pg" fallback
  fallback="/var/tmp/servetune-services-$(echo "$ROOT" | md5sum | cut -c1-8)/pg"
  if [ "${#d}" -gt 80 ]; then
    d="$fallback"
  fi
  mkdir -p "$d"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres:postgres "$d"
    if ! runuser -u postgres -- test -w "$d"; then
      d="$fallback"
      mkdir -p "$d"
      chown postgres:postgres "$d"
    fi
  fi
  echo "$d"
}

start_pg() {
  local bin d url
  bin="$(pg_bin)" || true
  if [ -z "$bin" ]; then
    apt_install "PostgreSQL (pg_ctl)" postgresql
    bin="$(pg_bin)" || die "PostgreSQL still not found under /usr/lib/postgresql after apt-get"
  fi
  d="$(pg_dir)"
  if [ ! -f "$d/data/PG_VERSION" ]; then
    log "initdb in $d/data"
    as_pg "$bin/initdb" -D "$d/data" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
    mkdir -p "$d/run"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$d/run"
  fi
  if ! as_pg "$bin/pg_ctl" -D "$d/data" status >/dev/null 2>&1; then
    log "starting PostgreSQL (socket $d/run, port $PORT)"
    as_pg "$bin/pg_ctl" -D "$d/data" -l "$d/log" -w -t 60 start \
      -o "-k $d/run -p $PORT -c listen_addresses='' -c fsync=off -c max_connections=50" >/dev/null
  fi
  url="postgresql+psycopg://postgres@/postgres?host=$d/run&port=$PORT"
  echo "SERVETUNE_PG_URL=$url" >"$DIR/pg.env"
  echo "SERVETUNE_PG_URL=$url"
}

stop_pg() {
  local bin d
  bin="$(pg_bin)" || return 0
  for d in "$DIR/pg" /var/tmp/servetune-services-*/pg; do
    if [ -f "$d/data/PG_VERSION" ]; then
      as_pg "$bin/pg_ctl" -D "$d/data" -m fast stop >/dev/null 2>&1 || true
    fi
  done
}

ensure_chromium() {
  if ! command -v chromium >/dev/null 2>&1; then
    apt_install chromium chromium fonts-dejavu-core
    command -v chromium >/dev/null || die "chromium still not on PATH after apt-get"
  fi
}

ensure_prometheus() {
  if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    apt_install prometheus prometheus
    command -v promtool >/dev/null || die "prometheus still not on PATH after apt-get"
  fi
}

stop_prometheus() {
  local pid
  pid="$(cat "$DIR/prometheus.pid" 2>/dev/null)" || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$DIR/prometheus.pid"
}

# A config change means a new scrape target: restart rather than reload, with fresh data.
start_prometheus() {
  local config="$1" port="${SERVETUNE_PROM_PORT:-59090}" url
  ensure_prometheus
  [ -f "$config" ] || die "prometheus config $config not found"
  promtool check config "$config" >&2 || die "promtool rejects $config"
  stop_prometheus
  rm -rf "$DIR/prometheus"
  mkdir -p "$DIR/prometheus"
  prometheus --config.file="$config" --storage.tsdb.path="$DIR/prometheus" \
    --web.listen-address="127.0.0.1:$port" --web.enable-lifecycle \
    >"$DIR/prometheus.log" 2>&1 &
  echo $! >"$DIR/prometheus.pid"
  url="http://127.0.0.1:$port"
  for _ in $(seq 100); do
    if curl -sf "$url/-/ready" >/dev/null 2>&1; then
      echo "SERVETUNE_PROM_URL=$url"
      return 0
    fi
    sleep 0.2
  done
  die "prometheus did not become ready on $url (see $DIR/prometheus.log)"
}

mkdir -p "$DIR"
case "${1:-all}" in
  # all: what `run.sh test` needs before any test runs. Prometheus is installed here, not
  # started (each monitor test starts its own): a test may call promtool before the
  # first start, and the engine tests run beside the rest, in any order.
  all) ensure_chromium && ensure_prometheus && start_pg ;;
  pg) start_pg ;;
  chromium) ensure_chromium ;;
  prometheus) if [ -n "${2:-}" ]; then start_prometheus "$2"; else ensure_prometheus; fi ;;
  prometheus-stop) stop_prometheus ;;
  stop) stop_pg && stop_prometheus ;;
  url) cat "$DIR/pg.env" ;;
  *)
    echo "usage: scripts/services.sh [all|pg|chromium|prometheus [CONFIG]|prometheus-stop|stop|url]" >&2
    exit 2
    ;;
esac
