#!/usr/bin/env bash
# Ray for the GPU machine, which has no network: its cp312 wheel (~79 MB) is over the device's
# 64 MiB carry limit, so the wheel and its dependencies are unpacked here, pruned of what a driver
# and a worker never load, and packed again with xz; bench/gpu_check.sh unpacks it (untar_ray).
#
#   bash bench/pack_ray.sh [PYTHON_VERSION] [OUT]     default 3.12 and .ray/ray.tar.xz
#   CHECK=1 bash bench/pack_ray.sh 3.11 /tmp/r.tar.xz also checks `import ray; ray.init()` from the
#                                                     unpacked archive alone (this machine's Python
#                                                     must be PYTHON_VERSION)
#
# Pruned: the Java jars, the dashboard's web client (the dashboard's agent stays: the raylet starts
# it), the libraries on top of Ray core (serve, tune, rllib, data, train, air, llm), test folders,
# type stubs, and the debug symbols of the two native programs and the core library (strip).
set -euo pipefail
PY=${1:-3.12}
OUT=${2:-.ray/ray.tar.xz}
VERSION=${RAY_VERSION:-2.60.0}
abi="cp${PY/./}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m pip download -q --only-binary=:all: --python-version "$PY" --implementation cp --abi "$abi" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$work/whl" "ray==$VERSION"
mkdir -p "$work/site"
for w in "$work"/whl/*.whl; do python3 -m zipfile -e "$w" "$work/site"; done
before=$(du -sm "$work/site" | cut -f1)

r="$work/site/ray"
rm -rf "$r/jars" "$r/dashboard/client" "$r"/{serve,tune,rllib,data,train,air,llm}
find "$work/site" -depth -type d \( -name tests -o -name __pycache__ \) -exec rm -rf {} +
find "$work/site" -name '*.pyi' -delete
if command -v strip > /dev/null; then
  strip --strip-debug "$r/_raylet.so" "$r/core/src/ray/raylet/raylet" "$r/core/src/ray/gcs/gcs_server"
fi
chmod +x "$r/core/src/ray/raylet/raylet" "$r/core/src/ray/gcs/gcs_server"  # zipfile drops the modes
after=$(du -sm "$work/site" | cut -f1)

mkdir -p "$(dirname "$OUT")"
tar cf - -C "$work/site" . | xz -9 -T0 > "$OUT"
echo "ray $VERSION for Python $PY: $(ls "$work"/whl | wc -l) wheels, ${before} MB unpacked, ${after} MB pruned," \
  "$(du -m "$OUT" | cut -f1) MB as $OUT"

if [ "${CHECK:-0}" = 1 ]; then  # the pruned tree alone, in a bare venv (no site-packages), a fresh local instance
  mkdir "$work/check"
  tar xJf "$OUT" -C "$work/check"
  python3 -m venv --without-pip "$work/venv"
  PYTHONPATH="$work/check" timeout 300 "$work/venv/bin/python" -c '
import ray
assert "/check/" in ray.__file__, ray.__file__
ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
@ray.remote
def f(x): return x + 1
assert ray.get(f.remote(1)) == 2
ray.shutdown()
print("pruned ray", ray.__version__, "runs from", ray.__file__)'
fi
