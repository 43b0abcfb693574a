#!/bin/bash
# usage: run_one.sh PROFILE SPEC SCHEME [OUTROOT]   (from the repository root)
# one `qconform run --profile PROFILE` (`certify` when PROFILE=certify) of one backend spec on one scheme, -j 1;
# prints "spec scheme rc <verdict counts> wall_s" from the console table.
set -u
prof=$1; spec=$2; scheme=$3; root=${4:-/tmp/r3}
R3=examples/independent-kernels/round3
B=qconform_r3.backend
export QCONFORM_EXTRA_BACKENDS="r3-a16=$B:R3A16,r3-a16-f32=$B:R3A16F32,r3-mx16=$B:R3Mx16,r3-w8a8=$B:R3W8A8,r3-w4a8=$B:R3W4A8,r3-w4a4=$B:R3W4A4,r3-moe=$B:R3Moe,r3-q=$B:R3Quant"
mkdir -p "$root/$prof"
out=$root/$prof/$(echo "$spec" | tr ':=' '__')-$scheme
rm -rf "$out"
t0=$(date +%s.%N)
if [ "$prof" = certify ]; then
  PYTHONPATH=$PWD:$PWD/$R3 timeout 1500 python -m conformance.cli.main certify --backend "$spec" --scheme "$scheme" \
    -j 1 --out "$out" > "$out.log" 2>&1
else
  PYTHONPATH=$PWD:$PWD/$R3 timeout 900 python -m conformance.cli.main run --backend "$spec" --profile "$prof" --scheme "$scheme" \
    -j 1 --no-progress --out "$out" > "$out.log" 2>&1
fi
rc=$?
t1=$(date +%s.%N)
line=$(grep -E "^\S+\s+$scheme\s+[0-9]+" "$out.log" | head -1)
[ "$prof" = certify ] && line="x x $(grep -E '^certification:' "$out.log" | tail -1)"
printf "%s\t%s\trc=%s\t%s\t%.1f\n" "$spec" "$scheme" "$rc" "$(echo $line | cut -d' ' -f3-)" "$(echo "$t1 - $t0" | bc)"
