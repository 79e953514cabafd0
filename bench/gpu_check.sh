#!/usr/bin/env bash
# Everything a GPU claim needs, in few device calls. Full logs and JSON go under $OUT
# (archived in $OUT/keep/logs.tgz: only 8 files come back); a short table is printed last.
#
#   bash bench/gpu_check.sh check   starters of every package (timed ones serially, the rest side by side),
#                                   repeatability, TileLang end to end, pytest -m gpu
#   bash bench/gpu_check.sh run     the offline run on the decode task (issue 5) and its table
#   bash bench/gpu_check.sh more    an offline run on each of the other packages (issue 6)
#   bash bench/gpu_check.sh two     on two GPUs: run on GPU 0; on GPU 1 the TileLang and prefill
#                                   re-checks, then more
#   bash bench/gpu_check.sh probe   on two GPUs: floor probe and decode table under both L2 flushes
#                                   on GPU 0; host noise, the strategy kernels of the other
#                                   packages and a repeated evaluation on GPU 1
#
# Reads the seed package from .seed/, py3.12 wheels from .whl/ and TileLang from .tl/tl.tar.xz
# (see docs/gpu.md). env: RUN_LANG=cuda|triton, RUN_LIMIT=seconds (run), MORE_LIMIT=seconds (more),
# TL_LIMIT=seconds (the TileLang run), DEADLINE=seconds (two).
set -uo pipefail
STAGE=${1:-check}
OUT=${OUT:-/tmp/optagent-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPTAGENT_RUNS_DIR="$OUT/runs"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
mkdir -p /tmp/site && ln -sfn "$PWD/agent" /tmp/site/optagent
untar_tl() { [ -f .tl/tl.tar.xz ] && [ ! -d /tmp/site/tilelang ] && tar xJf .tl/tl.tar.xz -C /tmp/site; true; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
oa() { python3 -m optagent.cli "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
SEED=.seed/flashattn_task_package
OURS=tasks/flashattn_task_package
MORE="ragged_prefill fused_moe mla_decode"

ev() {  # ev NAME TASK KERNEL [args...]
  local name=$1 task=$2 kernel=$3; shift 3
  /usr/bin/time -f "%e" -o "$OUT/$name.time" python3 -m optagent.cli eval "$task" "$kernel" --json "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $(cat "$OUT/$name.time") s"
}
export -f ev; export OUT

tilelang_run() {  # issue 8: an offline --language tilelang run on the seed package, and its leaderboard
  local start; start=$(date +%s)
  OPTAGENT_RUNS_DIR="$OUT/runs-tilelang" timeout $(( ${TL_LIMIT:-150} + 90 )) python3 -m optagent.cli run "$SEED" \
    --language tilelang --time-limit "${TL_LIMIT:-150}" --patience 3 > "$OUT/tilelang-run.log" 2>&1
  echo "tilelang run: exit $? in $(( $(date +%s) - start )) s"
  OPTAGENT_RUNS_DIR="$OUT/runs-tilelang" python3 -m optagent.cli leaderboard --diff > "$OUT/tilelang-leaderboard.log" 2>&1
  head -12 "$OUT/tilelang-leaderboard.log"
}

finish() {
  python3 bench/summarize.py "$OUT" > "$OUT/summary.txt" 2>&1
  (cd "$OUT" && tar czf /tmp/logs.tgz --exclude=keep . 2>/dev/null; mkdir -p keep && mv /tmp/logs.tgz keep/ \
    && find . -maxdepth 1 -type f ! -name summary.txt ! -name decode_table.txt ! -name run.log -delete; rm -rf runs*)
  cat "$OUT/summary.txt"
  [ -f "$OUT/decode_table.txt" ] && cat "$OUT/decode_table.txt"
  true
}

if [ "$STAGE" = check ]; then  # one GPU
  untar_tl &
  n=0
  for p in "$OURS" "$SEED" $(for m in $MORE; do echo "tasks/${m}_task_package"; done); do
    n=$((n + 1)); oa task validate "$p" > "$OUT/validate-$n.log" 2>&1 &
  done
  wait  # TileLang unpacked, packages validated
  cat "$OUT"/validate-*.log
  python3 -c "import tilelang; print('tilelang', tilelang.__version__)" >> "$OUT/gpu.txt" 2>&1
  # timed serially: seconds per candidate and repeatability
  ev ours-triton "$OURS" "$OURS/starter/decode_triton.py"
  ev ours-triton-again "$OURS" "$OURS/starter/decode_triton.py"
  ev ours-cuda "$OURS" "$OURS/starter/decode_cuda.cu"
  ev seed-triton "$SEED" "$SEED/starter/smoke_test-Triton.txt"
  ev seed-cuda "$SEED" "$SEED/starter/smoke_test-CUDAMaca.txt"
  # correctness only, side by side: GPU tests, cross-package starters, the other packages, TileLang
  IGNORE="--ignore=tests/test_llm_planner.py --ignore=tests/test_edits.py"
  timeout 330 python3 -m pytest -q -m gpu tests/test_integrity.py > "$OUT/pytest-gpu-integrity.log" 2>&1 &
  timeout 330 python3 -m pytest -q -m gpu tests $IGNORE --ignore=tests/test_integrity.py > "$OUT/pytest-gpu.log" 2>&1 &
  {
    echo "ours-triton-on-seed $SEED $OURS/starter/decode_triton.py"
    echo "ours-cuda-on-seed $SEED $OURS/starter/decode_cuda.cu"
    echo "seed-triton-on-ours $OURS $SEED/starter/smoke_test-Triton.txt"
    echo "seed-cuda-on-ours $OURS $SEED/starter/smoke_test-CUDAMaca.txt"
    echo "seed-tilelang $SEED $SEED/starter/smoke_test-Tilelang.txt"
    for m in $MORE; do
      for k in tasks/${m}_task_package/starter/*; do echo "$m-${k##*.} tasks/${m}_task_package $k"; done
    done
  } | timeout 320 xargs -P 4 -L 1 bash -c 'ev "$@"' _ &
  tilelang_run
  wait
  for f in "$OUT"/pytest-gpu*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; grep -E "^(FAILED|ERROR)" "$f" | head; done
fi

decode_run() {  # issue 5: the offline run on the decode task, then its table
  start=$(date +%s)
  oa run "$OURS" --language "${RUN_LANG:-cuda}" --time-limit "${RUN_LIMIT:-420}" > "$OUT/run.log" 2>&1
  echo "run: exit $?"
  echo "offline run wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/run.log"
  oa leaderboard --diff > "$OUT/leaderboard.log" 2>&1
  for d in "$OPTAGENT_RUNS_DIR"/*/; do oa show "$(basename "$d")" >> "$OUT/run.log" 2>&1; done
  tail -40 "$OUT/run.log"
  timeout 150 python3 bench/decode_table.py agent/strategies/paged_decode/splitkv{_gqa.py,_fused.py,.cu} \
    "$OPTAGENT_RUNS_DIR"/*/best/kernel.* > "$OUT/decode_table.txt" 2>&1
  timeout 90 python3 bench/floor_probe.py >> "$OUT/decode_table.txt" 2>&1
}

more_runs() {  # issue 6: an offline run on each of the other packages, starter and best per case
  for m in $MORE; do
    start=$(date +%s)
    oa run "tasks/${m}_task_package" --language triton --time-limit "${MORE_LIMIT:-120}" --patience 4 \
      > "$OUT/run-$m.log" 2>&1
    echo "$m run: exit $? in $(( $(date +%s) - start )) s"
  done
  for d in "$OPTAGENT_RUNS_DIR"/*/; do
    id=$(basename "$d")
    { oa show "$id"; oa show "$id" --step 0; } >> "$OUT/more-runs.log" 2>&1
  done
  oa leaderboard >> "$OUT/more-runs.log" 2>&1
}

recheck() {  # what the check stage found broken, once fixed: TileLang, the prefill package
  untar_tl
  ev seed-tilelang "$SEED" "$SEED/starter/smoke_test-Tilelang.txt" &
  ev ragged_prefill-py tasks/ragged_prefill_task_package tasks/ragged_prefill_task_package/starter/prefill_triton.py &
  ev ragged_prefill-cu tasks/ragged_prefill_task_package tasks/ragged_prefill_task_package/starter/prefill_cuda.cu &
  timeout 200 python3 -m pytest -q -m gpu tests/test_fresh_load.py tests/test_integrity.py -k "tilelang or floor or honest" \
    > "$OUT/pytest-recheck.log" 2>&1 &
  tilelang_run
  wait
  echo "pytest recheck: $(tail -1 "$OUT/pytest-recheck.log")"
}

probe_decode() {  # issue 5: what the timing method leaves reachable, and the strategies under both flushes
  timeout 100 python3 bench/floor_probe.py > "$OUT/decode_table.txt" 2>&1
  for how in zero read; do
    FLUSH=$how timeout 150 python3 bench/decode_table.py agent/strategies/paged_decode/splitkv{_gqa.py,_fused.py,.cu} \
      >> "$OUT/decode_table.txt" 2>&1
  done
}

probe_rest() {  # issues 2 and 6: host speed between processes; new strategies at their defaults; one kernel twice
  timeout 150 python3 bench/host_noise.py 5 > "$OUT/host_noise.log" 2>&1
  ev ragged_prefill-strategy tasks/ragged_prefill_task_package agent/strategies/ragged_prefill/flash_prefill.py
  ev fused_moe-strategy tasks/fused_moe_task_package agent/strategies/fused_moe/grouped_moe.py
  ev ours-triton "$OURS" "$OURS/starter/decode_triton.py"
  ev ours-triton-again "$OURS" "$OURS/starter/decode_triton.py"
  cat "$OUT/host_noise.log"
}

case "$STAGE" in
  run) decode_run ;;
  probe)
    (sleep "${DEADLINE:-540}"; pkill -f "optagent.cli|decode_table|floor_probe|host_noise") > /dev/null 2>&1 &
    watchdog=$!
    (export CUDA_VISIBLE_DEVICES=0; probe_decode) > "$OUT/lane0.log" 2>&1 &
    lane0=$!
    (export CUDA_VISIBLE_DEVICES=1; probe_rest) > "$OUT/lane1.log" 2>&1
    wait "$lane0"
    kill "$watchdog" 2>/dev/null
    cat "$OUT/lane1.log" "$OUT/lane0.log" ;;
  more) more_runs ;;
  two)  # two GPUs: the decode run alone on GPU 0; the rest on GPU 1
    python3 -c "from optagent.bench import measured_bandwidth_gbs as m; print(f'copy bandwidth {m():.0f} GB/s')"
    # whatever still runs at DEADLINE seconds is stopped, so that the logs always come back
    (sleep "${DEADLINE:-540}"; pkill -f "optagent.cli|decode_table|pytest") > /dev/null 2>&1 &
    watchdog=$!
    (export CUDA_VISIBLE_DEVICES=0; decode_run) > "$OUT/lane0.log" 2>&1 &
    lane0=$!
    (export CUDA_VISIBLE_DEVICES=1 OPTAGENT_RUNS_DIR="$OUT/runs-more"; recheck; more_runs) > "$OUT/lane1.log" 2>&1
    wait "$lane0"
    kill "$watchdog" 2>/dev/null
    cat "$OUT/lane1.log" "$OUT/lane0.log" ;;
esac
finish
