#!/usr/bin/env bash
# Server time per task (summed statement execution time of the drain's claim and completion
# statements, from pg_stat_statements), which the machine's load inflates far less than the wall
# clock. Needs shared_preload_libraries = 'pg_stat_statements' on the cluster.
# Usage: server-time.sh URL REPS N CLIENTS
set -euo pipefail
url=$1; reps=$2; n=$3; c=$4
cd "$(dirname "$0")/../../.."
psql "$url" -qc 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements'
for rep in $(seq 1 "$reps"); do
  for m in base lock gist; do
    psql "$url" -qAtc 'SELECT pg_stat_statements_reset()' >/dev/null
    line=$(node --import tsx bench/prototypes/range-leases/drive.ts --url "$url" --mode $m --clients "$c" --n "$n")
    stats=$(psql "$url" -qAtc "
      WITH s AS (
        SELECT sum(total_exec_time) FILTER (WHERE query ILIKE 'WITH locked AS MATERIALIZED%') AS claim_ms,
               sum(calls) FILTER (WHERE query ILIKE 'WITH locked AS MATERIALIZED%') AS claim_calls,
               sum(total_exec_time) FILTER (WHERE query ILIKE '%complete_ranges%' OR query ILIKE 'WITH u AS%') AS complete_ms
          FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()))
      SELECT json_build_object('claimUsPerTask', round((claim_ms * 1000 / $n)::numeric, 2),
                               'completeUsPerTask', round((complete_ms * 1000 / $n)::numeric, 2),
                               'claimCalls', claim_calls,
                               'claimMsPerCall', round((claim_ms / nullif(claim_calls, 0))::numeric, 3)) FROM s")
    echo "{\"rep\":$rep,\"server\":$stats,${line#\{}"
  done
done
