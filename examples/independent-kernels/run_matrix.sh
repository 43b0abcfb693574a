#!/bin/bash
# usage: run_matrix.sh PROFILE BACKEND[:bug=B] SCHEME [OUTROOT]  -> one TSV line: spec scheme pass fail crash unsup wall_s
set -u
prof=$1; spec=$2; scheme=$3; root=${4:-/tmp/indep}
out=$root/$prof/$(echo "$spec" | tr ':=' '__')-$scheme
t0=$(date +%s.%N)
PYTHONPATH=${QC_ROOT:-$PWD} timeout 900 python -m conformance.cli.main run --backend "$spec" --profile "$prof" --scheme "$scheme" \
  -j 1 --no-progress --out "$out" > "$out.log" 2>&1 || true
t1=$(date +%s.%N)
line=$(grep -E "^\S+\s+$scheme\s+[0-9]+" "$out.log" | head -1)
printf "%s\t%s\t%s\t%.1f\n" "$spec" "$scheme" "$(echo $line | cut -d" " -f3-)" "$(echo "$t1 - $t0" | bc)"
