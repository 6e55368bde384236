#!/usr/bin/env bash
# Test prerequisites that npm does not install: promtool (Debian package `prometheus`; the alert
# rule tests run `promtool check rules` / `promtool test rules`), chromium (the dashboard's
# browser tests), pg_dump (Debian package `postgresql-client`, or $PG_DUMP; the schema dump
# test), Python's psycopg (Debian package `python3-psycopg`, for $PYTHON, /usr/bin/python3 or
# python3; the SQL enqueue test calls add_task from Python), pgbouncer (test/pgbouncer.test.ts
# runs berth through it; Debian puts it in /usr/sbin) and pg_auto_failover (Debian package
# `postgresql-15-auto-failover`: pg_autoctl and the monitor's extension; the failover test runs a
# formation). Does nothing when all are there. As
# root with apt-get, installs what is missing; otherwise prints what to install and exits 1.
# `apt-get update` runs only when the install fails without it (a machine whose package lists are
# fresh enough skips it).
set -euo pipefail

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v "${PG_DUMP:-pg_dump}" >/dev/null 2>&1 || missing+=(postgresql-client)
# The Debian package serves the system Python, which may not be the first python3 on PATH.
has_psycopg() {
  local py
  for py in "${PYTHON:-}" /usr/bin/python3 python3; do
    [ -n "$py" ] && "$py" -c 'import psycopg' >/dev/null 2>&1 && return 0
  done
  return 1
}
has_psycopg || missing+=(python3-psycopg)
has_pgbouncer() { command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; }
has_pgbouncer || missing+=(pgbouncer)
# The monitor's extension lives with the server binaries the tests use ($BERTH_PG_BIN).
has_auto_failover() {
  local bin="${BERTH_PG_BIN:-/usr/lib/postgresql/15/bin}"
  command -v "${BERTH_PG_AUTOCTL:-pg_autoctl}" >/dev/null 2>&1 &&
    [ -f "$("$bin/pg_config" --sharedir 2>/dev/null)/extension/pgautofailover.control" ]
}
has_auto_failover || missing+=(postgresql-15-auto-failover)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "test-prereqs: missing ${missing[*]} (promtool comes with the Debian package prometheus)." >&2
  echo "test-prereqs: install as root: apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/test-prereqs-apt.log 2>&1
}

echo "test-prereqs: installing ${missing[*]} (apt-get; log in /tmp/test-prereqs-apt.log)" >&2
if ! install; then
  DEBIAN_FRONTEND=noninteractive apt-get update -q >>/tmp/test-prereqs-apt.log 2>&1
  if ! install; then
    tail -n 20 /tmp/test-prereqs-apt.log >&2
    echo "test-prereqs: apt-get install ${missing[*]} failed" >&2
    exit 1
  fi
fi

for tool in promtool chromium "${PG_DUMP:-pg_dump}"; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "test-prereqs: $tool is still not on PATH after the install" >&2
    exit 1
  fi
done
if ! has_auto_failover; then
  echo "test-prereqs: pg_autoctl or the pgautofailover extension is still missing after the install" >&2
  exit 1
fi
if ! has_psycopg; then
  echo "test-prereqs: no python3 can import psycopg after the install" >&2
  exit 1
fi
if ! has_pgbouncer; then
  echo "test-prereqs: pgbouncer is still missing after the install" >&2
  exit 1
fi
