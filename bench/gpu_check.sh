#!/usr/bin/env bash
# Everything a GPU claim needs, in one device call: install, validate, evaluate
# the starters of both decode packages (ours and the seed's), evaluate one twice
# for repeatability, run the GPU-only integrity tests, and the offline run.
# Full logs and JSON go under $OUT; a short table is printed last.
#   bash bench/gpu_check.sh [starters|run|all]   (the seed package is read from .seed/)
#   env: CROSS=0 skips the cross-package starter runs; RUN_LANG=cuda|triton, RUN_LIMIT=seconds for the run
set -uo pipefail
STAGE=${1:-all}
OUT=${OUT:-/tmp/optagent-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPTAGENT_RUNS_DIR="$OUT/runs"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
mkdir -p /tmp/site && ln -sfn "$PWD/agent" /tmp/site/optagent
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
oa() { python3 -m optagent.cli "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
SEED=.seed/flashattn_task_package
OURS=tasks/flashattn_task_package

ev() {  # ev NAME TASK KERNEL [args...]
  local name=$1 task=$2 kernel=$3; shift 3
  /usr/bin/time -f "%e" -o "$OUT/$name.time" python3 -m optagent.cli eval "$task" "$kernel" --json "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $(cat "$OUT/$name.time") s"
}

if [ "$STAGE" = starters ] || [ "$STAGE" = all ]; then
  oa task validate "$OURS" 2>&1 | tee "$OUT/validate.log"
  oa task validate "$SEED" 2>&1 | tee -a "$OUT/validate.log"
  ev ours-triton "$OURS" "$OURS/starter/decode_triton.py"
  ev ours-triton-again "$OURS" "$OURS/starter/decode_triton.py"
  ev ours-cuda "$OURS" "$OURS/starter/decode_cuda.cu"
  ev seed-triton "$SEED" "$SEED/starter/smoke_test-Triton.txt"
  ev seed-cuda "$SEED" "$SEED/starter/smoke_test-CUDAMaca.txt"
  if [ "${CROSS:-1}" = 1 ]; then  # every starter on both packages
    ev ours-triton-on-seed "$SEED" "$OURS/starter/decode_triton.py"
    ev ours-cuda-on-seed "$SEED" "$OURS/starter/decode_cuda.cu"
    ev seed-triton-on-ours "$OURS" "$SEED/starter/smoke_test-Triton.txt"
    ev seed-cuda-on-ours "$OURS" "$SEED/starter/smoke_test-CUDAMaca.txt"
  fi
  python3 -m pytest -q -m gpu tests --ignore=tests/test_llm_planner.py --ignore=tests/test_edits.py > "$OUT/pytest-gpu.log" 2>&1; echo "pytest -m gpu: exit $?"; tail -3 "$OUT/pytest-gpu.log"
fi
if [ "$STAGE" = run ] || [ "$STAGE" = all ]; then
  start=$(date +%s)
  oa run "$OURS" --language "${RUN_LANG:-triton}" --time-limit "${RUN_LIMIT:-420}" > "$OUT/run.log" 2>&1
  echo "run: exit $?"
  echo "offline run wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/run.log"
  oa leaderboard --diff > "$OUT/leaderboard.log" 2>&1
  tail -25 "$OUT/run.log"
  head -20 "$OUT/leaderboard.log"
  python3 bench/decode_table.py agent/strategies/paged_decode/splitkv_*.py "$OUT"/runs/*/best/kernel.py \
    > "$OUT/decode_table.txt" 2>&1
fi
python3 bench/summarize.py "$OUT" > "$OUT/summary.txt" 2>&1
# Only 8 files come back from the device: everything else travels in one archive.
(cd "$OUT" && tar czf /tmp/logs.tgz --exclude=runs . runs 2>/dev/null; mkdir -p keep && mv /tmp/logs.tgz keep/ \
  && find . -maxdepth 1 -type f ! -name summary.txt ! -name check.log ! -name decode_table.txt ! -name run.log -delete; rm -rf runs)
cat "$OUT/summary.txt"
[ -f "$OUT/decode_table.txt" ] && cat "$OUT/decode_table.txt"
