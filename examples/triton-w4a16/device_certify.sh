#!/usr/bin/env bash
# Certify and fingerprint the Triton W4A16 plugin on a CUDA machine (run from the repository root).
# Writes to $OUT: env.txt, certify.log, triton-bundle.tgz, fp-*.json, fp.log.
set -u
OUT=${OUT:-qconform-out/triton-device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 - <<'PY' 2>&1 | tee "$OUT/env.txt"
import torch, triton, numpy, safetensors, ml_dtypes
print("torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__,
      "device", torch.cuda.get_device_name(0))
PY
# the plugin through its entry point; offline images without pip/setuptools fall back to the env variable
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e examples/triton-w4a16 >>"$OUT/env.txt" 2>&1; then
  echo "pip install failed: registering through QCONFORM_EXTRA_BACKENDS" | tee -a "$OUT/env.txt"
  export PYTHONPATH=$PWD/examples/triton-w4a16 QCONFORM_EXTRA_BACKENDS=triton-w4a16=qconform_triton_w4a16.backend:TritonW4A16Backend
fi
python3 -m conformance.cli.main backends 2>&1 | tee -a "$OUT/env.txt"
rm -rf /tmp/triton-bundle
time python3 -m conformance.cli.main certify --backend triton-w4a16 --profile certification --scheme w4a16 \
  --out /tmp/triton-bundle -j 4 --no-progress 2>&1 | tail -40 | tee "$OUT/certify.log"
python3 -m conformance.cli.main verify-bundle /tmp/triton-bundle 2>&1 | tail -8 | tee -a "$OUT/certify.log"
tar czf "$OUT/triton-bundle.tgz" -C /tmp triton-bundle
for spec in "triton-w4a16 bfloat16" "triton-w4a16 float16" "cuda bfloat16"; do
  set -- $spec
  python3 -m conformance.cli.main fingerprint --backend "$1" --act-dtype "$2" --json "$OUT/fp-$1-$2.json" 2>/dev/null \
    | tee -a "$OUT/fp.log"
done
