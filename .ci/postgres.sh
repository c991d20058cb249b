#!/usr/bin/env bash
# Start a throw-away PostgreSQL server for the search tests (tests/test_search.py, issue 6).
#
# Usage (from .ci/run, before `make test`):   eval "$(.ci/postgres.sh)"
# stdout is exactly one line, `export STUDY_TEST_PG_URL=postgresql://...`; everything else goes to
# stderr. The tests that need a real server skip with a reason when STUDY_TEST_PG_URL is unset.
#
# WHY a private cluster (initdb in a temp folder, own port) instead of the distro's service: it needs
# no systemd, leaves the machine's own clusters alone, and re-running the script reuses the server.
set -euo pipefail
PORT="${STUDY_PG_PORT:-55432}"
DATA="${STUDY_PG_DATA:-/tmp/study-pg-$PORT}"
DB=study_test
log() { echo "postgres.sh: $*" >&2; }

if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  log "installing Debian postgresql"
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq postgresql >/dev/null) >&2
fi
BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"

# The server refuses to run as root; use the `postgres` account the package created.
RUN=()
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql postgres
  RUN=(runuser -u postgres --)
fi

if ! "${RUN[@]}" "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" 2>/dev/null; then
  if [ ! -f "$DATA/PG_VERSION" ]; then
    mkdir -p "$DATA"
    [ "$(id -u)" = 0 ] && chown postgres "$DATA"
    log "initdb $DATA"
    "${RUN[@]}" "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 >/dev/null
  fi
  log "starting on 127.0.0.1:$PORT"
  # Unix socket in the data folder: /var/run/postgresql may not exist or belong to another cluster.
  # max_connections: each search worker holds a small pool; the tests start several workers.
  "${RUN[@]}" "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 \
    -o "-p $PORT -k $DATA -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off" start >&2
fi
if ! "${RUN[@]}" "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc \
     "SELECT 1 FROM pg_database WHERE datname='$DB'" | grep -q 1; then
  "${RUN[@]}" "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
fi
echo "export STUDY_TEST_PG_URL=postgresql+psycopg2://postgres@127.0.0.1:$PORT/$DB"
