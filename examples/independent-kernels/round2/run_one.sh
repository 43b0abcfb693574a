#!/bin/bash
# usage: run_one.sh PROFILE SPEC SCHEME [OUTROOT]   (from the repository root)
# one `qconform run` (`--tier property --profile ci` when PROFILE=property, `certify` when PROFILE=certify) of one backend spec on one scheme, -j 1; prints
# "spec scheme <verdict counts> wall_s" from the console table.
set -u
prof=$1; spec=$2; scheme=$3; root=${4:-/tmp/r2}
R2=examples/independent-kernels/round2
export QCONFORM_EXTRA_BACKENDS="r2-a16=qconform_r2.backend:R2A16,r2-a16-bf16w=qconform_r2.backend:R2A16Bf16Weights,r2-mx16=qconform_r2.backend:R2Mx16,r2-w8a8=qconform_r2.backend:R2W8A8,r2-w4a8=qconform_r2.backend:R2W4A8,r2-w4a4=qconform_r2.backend:R2W4A4,r2-moe=qconform_r2.backend:R2Moe"
mkdir -p "$root/$prof"
out=$root/$prof/$(echo "$spec" | tr ':=' '__')-$scheme
rm -rf "$out"
t0=$(date +%s.%N)
if [ "$prof" = property ]; then
  PYTHONPATH=$PWD:$PWD/$R2 timeout 1500 python -m conformance.cli.main run --backend "$spec" --tier property --profile ci --scheme "$scheme" \
    -j 1 --no-progress --out "$out" > "$out.log" 2>&1
elif [ "$prof" = certify ]; then
  PYTHONPATH=$PWD:$PWD/$R2 timeout 1500 python -m conformance.cli.main certify --backend "$spec" --scheme "$scheme" \
    -j 1 --out "$out" > "$out.log" 2>&1
else
  PYTHONPATH=$PWD:$PWD/$R2 timeout 900 python -m conformance.cli.main run --backend "$spec" --profile "$prof" --scheme "$scheme" \
    -j 1 --no-progress --out "$out" > "$out.log" 2>&1
fi
rc=$?
t1=$(date +%s.%N)
line=$(grep -E "^\S+\s+$scheme\s+[0-9]+" "$out.log" | head -1)
[ "$prof" = certify ] && line="x x $(grep -E '^certification:' "$out.log" | tail -1)"
printf "%s\t%s\trc=%s\t%s\t%.1f\n" "$spec" "$scheme" "$rc" "$(echo $line | cut -d' ' -f3-)" "$(echo "$t1 - $t0" | bc)"
