#!/usr/bin/env bash
# Interleaved drains: per repetition and concurrency, base (berth today), lock and gist, one
# after the other on the same cluster. One JSON line per run on stdout.
# Usage: run.sh URL REPS N [K]
set -euo pipefail
url=$1; reps=$2; n=$3; k=${4:-100}
cd "$(dirname "$0")/../../.."
for rep in $(seq 1 "$reps"); do
  for c in 10 50; do
    for m in base lock gist; do
      node --import tsx bench/prototypes/range-leases/drive.ts --url "$url" --mode $m --clients $c --n "$n" --k "$k" \
        | sed "s/^{/{\"rep\":$rep,/"
    done
  done
done
