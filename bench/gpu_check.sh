#!/usr/bin/env bash
# Everything a GPU claim needs, in few device calls. Full logs and JSON go under $OUT
# (archived in $OUT/keep/logs.tgz: only 8 files come back); a short table is printed last.
#
#   bash bench/gpu_check.sh check   starters of every package (timed ones serially, the rest side by side),
#                                   repeatability, TileLang end to end, pytest -m gpu
#   bash bench/gpu_check.sh run     the offline run on the decode task (issue 5) and its tables
#   bash bench/gpu_check.sh more    an offline run on each of the other packages (issue 6)
#   bash bench/gpu_check.sh variants  knob variants of the CUDA decode strategies, side by side (issue 5)
#   LANE0="decode_run decode_tables" LANE1="pkg_run:fused_moe:150 repeat" bash bench/gpu_check.sh lanes
#                                   on two GPUs: the steps of LANE0 on GPU 0, those of LANE1 on
#                                   GPU 1 (steps: the functions below, arguments after colons)
#                                   e.g. LANE1="trace:4/16384:1/1024": where a bulk-kernel launch spends its time
#   COST_ARGS="--budget 300" bash bench/gpu_check.sh cost   seconds per candidate, their phases, GPU-busy share,
#                                   candidates/hour, re-time cost, repeatability (issue 31, bench/eval_cost.py)
#   STEPS="eval_cost_before eval_cost" ...   the same, on the tree in .before/ first (git archive REV agent prompts)
#   STEPS=referee_rtt bash bench/gpu_check.sh steps   a referee's round trip against a GPU call (issue 31)
#   STEPS="host_cores repeat_probe" bash bench/gpu_check.sh steps   the host's slow stretches per core; one kernel's
#                                   eager time across fresh processes against the host probe (issue 31);
#                                   clock_ramp: an idle GPU's first calls against its steady time
#   STEPS="triton_compile triton_compile:FILE.py" ...   a Triton kernel's first calls: compiles, launcher
#                                   builds, loads; serially and compiled on threads after a dry pass (issue 31)
#   STEPS=ipc_probe bash bench/gpu_check.sh steps   a referee's memory opened by a launcher under bwrap (CUDA IPC)
#   STEPS=ray_overhead bash bench/gpu_check.sh steps   Ray's overhead per candidate against the local pool
#                                   (issue 24; needs .ray/ray.tar.xz from bench/pack_ray.sh)
#
# Reads the seed package from .seed/, py3.12 wheels from .whl/, TileLang from .tl/tl.tar.xz and
# Ray from .ray/ray.tar.xz (see docs/gpu.md). env: RUN_LANG=cuda|triton, RUN_LIMIT=seconds (run),
# MORE_LIMIT=seconds (more), TL_LIMIT=seconds (the TileLang run), DEADLINE=seconds (lanes),
# RAY_CANDIDATES, RAY_ORDER, RAY_LIMIT (ray_overhead).
set -uo pipefail
STAGE=${1:-${STAGE:-check}}  # the argument, else $STAGE
OUT=${OUT:-/tmp/optagent-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OPTAGENT_RUNS_DIR="$OUT/runs"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
mkdir -p /tmp/site && ln -sfn "$PWD/agent" /tmp/site/optagent
# bubblewrap for the workers' isolation, from .debs/ (apt-get download bubblewrap libcap2) where the machine lacks it
if [ -d .debs ] && ! command -v bwrap > /dev/null; then dpkg -i .debs/*.deb > /dev/null 2>&1 || echo "bwrap: not installed"; fi
untar_tl() { [ -f .tl/tl.tar.xz ] && [ ! -d /tmp/site/tilelang ] && tar xJf .tl/tl.tar.xz -C /tmp/site; true; }
untar_ray() { [ -f .ray/ray.tar.xz ] && [ ! -d /tmp/site/ray ] && tar xJf .ray/ray.tar.xz -C /tmp/site; true; }  # bench/pack_ray.sh
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
oa() { python3 -m optagent.cli.main "$@"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
SEED=.seed/flashattn_task_package
OURS=tasks/flashattn_task_package
MORE="ragged_prefill fused_moe mla_decode"

ev() {  # ev NAME TASK KERNEL [args...]
  local name=$1 task=$2 kernel=$3; shift 3
  /usr/bin/time -f "%e" -o "$OUT/$name.time" python3 -m optagent.cli.main eval "$task" "$kernel" --json-out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $(cat "$OUT/$name.time") s"
}
export -f ev; export OUT

tilelang_run() {  # issue 8: an offline --language tilelang run on the seed package, and its leaderboard
  local start; start=$(date +%s)
  OPTAGENT_RUNS_DIR="$OUT/runs-tilelang" timeout $(( ${TL_LIMIT:-150} + 90 )) python3 -m optagent.cli.main run "$SEED" \
    --language tilelang --time-limit "${TL_LIMIT:-150}" --patience 3 > "$OUT/tilelang-run.log" 2>&1
  echo "tilelang run: exit $? in $(( $(date +%s) - start )) s"
  OPTAGENT_RUNS_DIR="$OUT/runs-tilelang" python3 -m optagent.cli.main leaderboard --diff > "$OUT/tilelang-leaderboard.log" 2>&1
  head -12 "$OUT/tilelang-leaderboard.log"
}

finish() {
  python3 bench/summarize.py "$OUT" > "$OUT/summary.txt" 2>&1
  (cd "$OUT" && tar czf /tmp/logs.tgz --exclude=keep . 2>/dev/null; mkdir -p keep && mv /tmp/logs.tgz keep/ \
    && find . -maxdepth 1 -type f ! -name summary.txt ! -name 'decode_table*.txt' ! -name 'eval_cost*' ! -name 'eval_profile*' ! -name run.log -delete; rm -rf runs*)
  cat "$OUT/summary.txt"
  cat "$OUT"/decode_table*.txt 2>/dev/null  # one per GPU when lanes ran variants
  true
}


decode_run() {  # issue 5: the offline run on the decode task
  start=$(date +%s)
  oa run "$OURS" --language "${RUN_LANG:-cuda}" --time-limit "${RUN_LIMIT:-420}" > "$OUT/run.log" 2>&1
  echo "run: exit $?"
  echo "offline run wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/run.log"
  oa leaderboard --diff > "$OUT/leaderboard.log" 2>&1
  for d in "$OPTAGENT_RUNS_DIR"/*/; do oa show "$(basename "$d")" >> "$OUT/run.log" 2>&1; done
  tail -40 "$OUT/run.log"
}

decode_tables() {  # issue 5: floor probe, then strategies (and this lane's best kernels) under both L2 flushes
  timeout 100 python3 bench/floor_probe.py >> "$OUT/decode_table.txt" 2>&1
  for how in zero read; do
    FLUSH=$how timeout 150 python3 bench/decode_table.py agent/search/strategies/paged_decode/splitkv{_fused.py,.cu,_bulk.cu} \
      $(ls "$OPTAGENT_RUNS_DIR"/*/best/kernel.* 2>/dev/null) >> "$OUT/decode_table.txt" 2>&1
  done
}

variants() {  # issue 5: knob variants of the CUDA decode strategies side by side (VARIANTS: see decode_variants.py)
  # in lanes, VARIANTS0 / VARIANTS1 (when set) are the lists of GPU 0 / GPU 1, with tables of their own;
  # FLOOR=0 leaves out the floor probe, SEQ=0 the sequential-pages table (each costs minutes)
  local gpu=${CUDA_VISIBLE_DEVICES:-} list; local specs="VARIANTS$gpu"
  local table="$OUT/decode_table${gpu:+-gpu$gpu}.txt"
  list=$(python3 bench/decode_variants.py "$OUT/variants$gpu" ${!specs:-${VARIANTS:-}} 2> "$OUT/variants-build$gpu.log")
  cat "$OUT/variants-build$gpu.log"
  [ "${FLOOR:-1}" = 1 ] && timeout 100 python3 bench/floor_probe.py >> "$table" 2>&1
  for how in zero read; do
    FLUSH=$how STARTER=0 timeout 240 python3 bench/decode_table.py $list >> "$table" 2>&1
  done
  # the same pages in sequence: what the contest's scattered pages cost
  [ "${SEQ:-1}" = 1 ] && TABLE=seq FLUSH=read STARTER=0 timeout 150 python3 bench/decode_table.py \
    $(echo "$list" | grep -E "/(splitkv|bulk|nomath)\.cu$") >> "$table" 2>&1
  true
}

pkg_run() {  # pkg_run NAME SECONDS: issue 6, an offline run on tasks/NAME_task_package; starter and best per case
  local m=$1 start; start=$(date +%s)
  OPTAGENT_RUNS_DIR="$OUT/runs-$m" timeout $(( $2 + 300 )) python3 -m optagent.cli.main run "tasks/${m}_task_package" \
    --language triton --time-limit "$2" --patience 4 > "$OUT/run-$m.log" 2>&1
  echo "$m run: exit $? in $(( $(date +%s) - start )) s"
  for d in "$OUT/runs-$m"/*/; do
    OPTAGENT_RUNS_DIR="$OUT/runs-$m" oa show "$(basename "$d")" >> "$OUT/more-runs.log" 2>&1
    OPTAGENT_RUNS_DIR="$OUT/runs-$m" oa show "$(basename "$d")" --step 0 >> "$OUT/more-runs.log" 2>&1
  done
}

repeat() {  # issue 2: each decode starter evaluated twice, one after the other
  for lang in triton cuda; do
    local k; k=$(ls "$OURS"/starter/decode_"$lang".*)
    ev "ours-$lang" "$OURS" "$k"
    ev "ours-$lang-again" "$OURS" "$k"
  done
}

gpu_tests() {  # pytest -m gpu: the integrity file and the rest, side by side
  IGNORE="--ignore=tests/test_llm_planner.py --ignore=tests/test_edits.py"
  timeout 330 python3 -m pytest -q -m gpu tests/test_integrity.py > "$OUT/pytest-gpu-integrity.log" 2>&1 &
  timeout 330 python3 -m pytest -q -m gpu tests $IGNORE --ignore=tests/test_integrity.py > "$OUT/pytest-gpu.log" 2>&1
  wait
  for f in "$OUT"/pytest-gpu*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; grep -E "^(FAILED|ERROR)" "$f" | head; done
}

gpu_pytest() {  # gpu_pytest FILE [-k EXPRESSION]: some of the GPU tests
  local log; log="$OUT/pytest-$(basename "$1" .py)-$RANDOM.log"
  timeout 400 python3 -m pytest -q -m gpu "$1" ${2:+-k "$2"} > "$log" 2>&1
  echo "pytest -m gpu $1 ${2:+-k $2}: $(tail -1 "$log")"; grep -E "^(FAILED|ERROR|E  )" "$log" | head -20
}

trace() {  # trace [FILE.cu] [BS/SEQLEN ...]: where a bulk-kernel launch spends its time, block by block (FLUSHES)
  local src=${SOURCE:-}; case "${1:-}" in *.cu) src=$1; shift ;; esac
  local log="$OUT/decode_trace-$(basename "${src:-splitkv_bulk.cu}" .cu).txt"
  SOURCE=$src FLUSHES=${FLUSHES:-zero} timeout 150 python3 bench/decode_trace.py "$@" > "$log" 2>&1
  cat "$log"
}

facts() {  # the ceilings every floor is measured against
  python3 -c "from optagent.worker.bench import measured_bandwidth_gbs as b, measured_matmul_tflops as m
print(f'copy bandwidth {b():.0f} GB/s, bf16 matmul {m():.0f} TFLOP/s')"
}

pause() { sleep "$1"; }  # keeps a lane's work off the other lane's timed evaluations

host_noise() {  # issue 2: host speed between fresh processes
  timeout 150 python3 bench/host_noise.py 5 > "$OUT/host_noise.log" 2>&1
  cat "$OUT/host_noise.log"
}

lanes() {  # LANE0 and LANE1: steps run one after another on GPU 0 and GPU 1 (a step: function[:arg[:arg]])
  # whatever still runs at DEADLINE seconds is stopped, so that the logs always come back
  (sleep "${DEADLINE:-540}"; pkill -f "optagent.cli.main|decode_table|floor_probe|host_noise|pytest") > /dev/null 2>&1 &
  local watchdog=$! lane0
  (export CUDA_VISIBLE_DEVICES=0; for s in ${LANE0:-}; do IFS=: read -ra a <<< "$s"; "${a[@]}"; done) \
    > "$OUT/lane0.log" 2>&1 &
  lane0=$!
  (export CUDA_VISIBLE_DEVICES=1 OPTAGENT_RUNS_DIR="$OUT/runs-1"
   for s in ${LANE1:-}; do IFS=: read -ra a <<< "$s"; "${a[@]}"; done) > "$OUT/lane1.log" 2>&1
  wait "$lane0"
  kill "$watchdog" 2>/dev/null
  cat "$OUT/lane1.log" "$OUT/lane0.log"
}

validate_all() {  # optagent task validate on every package, side by side
  local n=0
  for p in "$OURS" "$SEED" $(for m in $MORE; do echo "tasks/${m}_task_package"; done); do
    n=$((n + 1)); oa task validate "$p" > "$OUT/validate-$n.log" 2>&1 &
  done
  wait
  cat "$OUT"/validate-*.log
}

starters() {  # correctness, four at a time: starters across the decode packages, the other packages' starters
  untar_tl
  {
    echo "ours-triton-on-seed $SEED $OURS/starter/decode_triton.py"
    echo "ours-cuda-on-seed $SEED $OURS/starter/decode_cuda.cu"
    echo "seed-triton-on-ours $OURS $SEED/starter/smoke_test-Triton.txt"
    echo "seed-cuda-on-ours $OURS $SEED/starter/smoke_test-CUDAMaca.txt"
    echo "seed-tilelang $SEED $SEED/starter/smoke_test-Tilelang.txt"
    for m in $MORE; do
      for k in tasks/${m}_task_package/starter/*; do echo "$m-${k##*.} tasks/${m}_task_package $k"; done
    done
  } | timeout 320 xargs -P 4 -L 1 bash -c 'ev "$@"' _
}

check_all() {  # one GPU: the check stage
  untar_tl &
  validate_all
  wait  # TileLang unpacked
  python3 -c "import tilelang; print('tilelang', tilelang.__version__)" >> "$OUT/gpu.txt" 2>&1
  # timed serially: seconds per candidate and repeatability
  ev ours-triton "$OURS" "$OURS/starter/decode_triton.py"
  ev ours-triton-again "$OURS" "$OURS/starter/decode_triton.py"
  ev ours-cuda "$OURS" "$OURS/starter/decode_cuda.cu"
  ev seed-triton "$SEED" "$SEED/starter/smoke_test-Triton.txt"
  ev seed-cuda "$SEED" "$SEED/starter/smoke_test-CUDAMaca.txt"
  # correctness only, side by side: GPU tests, cross-package starters, the other packages, TileLang
  gpu_tests > "$OUT/gpu-tests.log" 2>&1 &
  starters &
  tilelang_run
  wait
  cat "$OUT/gpu-tests.log"
}

decode_eval() {  # the decode Triton starter once: its table, isolation, cost split and compiler facts
  ev decode_starter "$OURS" "$OURS/starter/decode_triton.py"
  grep -E "^(PASSED|FAILED|isolation|cost|timer)|registers|spill" "$OUT/decode_starter.log" | head -12
}

width_bench() {  # issue 20: the offline decode search at width 1 and 4, WIDTH_LIMIT seconds each (bench/search_width.py)
  timeout $(( 2 * ${WIDTH_LIMIT:-190} + 160 )) python3 bench/search_width.py --widths "${WIDTHS:-1,4}" \
    --time-limit "${WIDTH_LIMIT:-190}" --max-steps 60 --out "$OUT/width" > "$OUT/width.txt" 2> "$OUT/width.log"
  echo "width bench: exit $?"; cat "$OUT/width.txt"; grep -E "REJECTED|FAILED|Error" "$OUT/width.log" | head -5
}

ncu_probe() {  # issue 21: does ncu read the counters here, as root and inside bwrap as the workers run? its CSV kept
  cat > /tmp/ncu_k.py <<'PY'
import torch
x = torch.randn(1 << 26, device="cuda"); y = x * 2.0; a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16); b = a @ a
torch.cuda.synchronize()
PY
  local secs="--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats"
  grep -i profiling /proc/driver/nvidia/params > "$OUT/ncu_params.txt" 2>&1; cat "$OUT/ncu_params.txt"
  timeout 120 ncu --clock-control none $secs --csv --page details python3 /tmp/ncu_k.py > "$OUT/ncu_details.csv" 2> "$OUT/ncu_details.err"
  echo "ncu details (root): exit $?, $(wc -l < "$OUT/ncu_details.csv") lines"; head -c 2500 "$OUT/ncu_details.csv"; tail -3 "$OUT/ncu_details.err"
  timeout 120 ncu --clock-control none $secs --csv --page raw python3 /tmp/ncu_k.py > "$OUT/ncu_raw.csv" 2> "$OUT/ncu_raw.err"
  echo "ncu raw: exit $?, $(wc -c < "$OUT/ncu_raw.csv") bytes"
  bwrap --unshare-user --uid 65534 --gid 65534 --unshare-pid --unshare-net --die-with-parent --new-session \
    --ro-bind / / --dev /dev --proc /proc $(for n in /dev/nvidia*; do echo --dev-bind-try $n $n; done) --bind /tmp /tmp \
    timeout 120 ncu --clock-control none --section SpeedOfLight --csv --page details python3 /tmp/ncu_k.py \
    > "$OUT/ncu_bwrap.csv" 2> "$OUT/ncu_bwrap.err"
  echo "ncu in bwrap as nobody: exit $?, $(wc -l < "$OUT/ncu_bwrap.csv") lines"; head -c 800 "$OUT/ncu_bwrap.csv"; tail -3 "$OUT/ncu_bwrap.err"
  ncu --version | tail -1
}

step_mode() {  # issue 22: an outside agent's session in step mode on the decode task: 3 rounds, then show
  local d=agent/search/strategies/paged_decode k="$OUT/proposals" rd="$OUT/runs-step" id
  mkdir -p "$k"
  cp $d/splitkv_gqa.py "$k/gqa.py"; sed 's/^PAGES_PER_ITER = 8 /PAGES_PER_ITER = 4 /' $d/splitkv_gqa.py > "$k/gqa_p4.py"
  cp $d/splitkv_fused.py "$k/fused.py"
  sed 's/^WAVES = 1 /WAVES = 2 /' $d/splitkv_gqa.py > "$k/gqa_w2.py"
  sed 's/^NUM_WARPS = 4 /NUM_WARPS = 8 /' $d/splitkv_gqa.py > "$k/gqa_nw8.py"
  OPTAGENT_RUNS_DIR=$rd oa run "$OURS" --planner external --language triton ${PROFILE:+--profile} ${STEP_CASES:+--cases $STEP_CASES} --json \
    > "$OUT/step-start.json" 2> "$OUT/step-start.log"; echo "step mode start: exit $?"
  id=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$OUT/step-start.json") || return
  OPTAGENT_RUNS_DIR=$rd oa propose "$id" "$k/gqa.py" "$k/gqa_p4.py" --idea "split-KV flash-decoding with GQA" \
    --idea "the same, 4 pages per iteration" > "$OUT/step-r1.txt" 2>&1; echo "round 1: exit $?"
  OPTAGENT_RUNS_DIR=$rd oa propose "$id" "$k/fused.py" --idea "one launch: the last split merges" \
    > "$OUT/step-r2.txt" 2>&1; echo "round 2: exit $?"
  OPTAGENT_RUNS_DIR=$rd oa propose "$id" "$k/gqa_w2.py" "$k/gqa_nw8.py" --idea "two waves of splits" \
    --idea "8 warps" > "$OUT/step-r3.txt" 2>&1; echo "round 3: exit $?"
  OPTAGENT_RUNS_DIR=$rd oa show "$id" > "$OUT/step-show.txt" 2>&1
  OPTAGENT_RUNS_DIR=$rd oa feedback "$id" > "$OUT/step-feedback.txt" 2>&1
  cat "$OUT/step-show.txt"
}

ray_overhead() {  # issue 24: Ray's overhead per candidate against the local pool on one GPU (bench/ray_overhead.py)
  untar_ray
  python3 -c "import ray; print('ray', ray.__version__)" >> "$OUT/gpu.txt" 2>&1 || { echo "ray: not importable (.ray/ray.tar.xz?)"; return; }
  timeout "${RAY_LIMIT:-480}" python3 bench/ray_overhead.py --candidates "${RAY_CANDIDATES:-8}" \
    --order "${RAY_ORDER:-local,ray}" --out "$OUT/ray_overhead.json" > "$OUT/ray_overhead.txt" 2> "$OUT/ray_overhead.log"
  echo "ray overhead: exit $?"; cat "$OUT/ray_overhead.txt"; grep -E "Error|error:" "$OUT/ray_overhead.log" | head -5
}

steps() {  # STEPS="fn[:arg[:arg]] ...": the named functions one after another, on one GPU
  for s in $STEPS; do IFS=: read -r -a part <<< "$s"; "${part[@]}"; done
}

eval_cost() {  # issue 31: seconds per candidate and where they go (bench/eval_cost.py; COST_ARGS: its options)
  timeout "${COST_TIMEOUT:-570}" python3 bench/eval_cost.py --json-out "$OUT/eval_cost.json" ${COST_ARGS:-} 2>&1 \
    | tee "$OUT/eval_cost.txt" | grep -vE "^\s+\.\.\. "
}

eval_cost_before() {  # eval_cost_before [DIR]: eval_cost on the tree in DIR (default .before/: git archive REV agent
  # prompts | tar -x -C .before), its own cache: before and after in one call, on one machine (COST_ARGS_BEFORE, else
  # COST_ARGS); a second DIR (.variant/) gives a third tree to compare
  local dir=${1:-.before} name; name=$(basename "$dir" | tr -d .)
  mkdir -p "/tmp/site-$name" && ln -sfn "$PWD/$dir/agent" "/tmp/site-$name/optagent"
  OPTAGENT_CACHE="/tmp/cache-$name" PYTHONPATH="/tmp/site-$name:$PYTHONPATH" timeout "${COST_TIMEOUT:-570}" \
    python3 bench/eval_cost.py --json-out "$OUT/eval_cost-$name.json" ${COST_ARGS_BEFORE:-${COST_ARGS:-}} 2>&1 \
    | tee "$OUT/eval_cost-$name.txt" | grep -vE "^\s+\.\.\. "
}

referee_rtt() {  # issue 31: a referee's round trip to a launcher process against the GPU call (bench/referee_rtt.py)
  timeout "${RTT_TIMEOUT:-200}" python3 bench/referee_rtt.py ${RTT_ARGS:-} > "$OUT/eval_cost-rtt.txt" 2>&1
  echo "referee rtt: exit $?"; cat "$OUT/eval_cost-rtt.txt"
}

ipc_probe() {  # issue 31: a referee's inputs and outputs in a launcher's reach through CUDA IPC, under bwrap (bench/ipc_probe.py)
  for iso in bwrap none; do
    timeout 90 python3 bench/ipc_probe.py --isolation "$iso" ${IPC_ARGS:-} > "$OUT/ipc-$iso.txt" 2>&1
    echo "ipc probe ($iso): exit $?"; tail -3 "$OUT/ipc-$iso.txt"
  done
}

host_cores() {  # issue 31: the host's slow stretches, per core and machine-wide (bench/host_cores.py)
  timeout 90 python3 bench/host_cores.py "${CORES_S:-20}" > "$OUT/host_cores.txt" 2>&1
  echo "host cores: exit $?"; cat "$OUT/host_cores.txt" | tee -a "$OUT/eval_cost-diag.txt"
}

host_memory() {  # issue 31: are fresh processes slow where their memory is new to the machine? (bench/host_memory.py)
  timeout 150 python3 bench/host_memory.py ${MEMORY_ARGS:-} > "$OUT/host_memory.txt" 2>&1
  echo "host memory: exit $?"; cat "$OUT/host_memory.txt" | tee -a "$OUT/eval_cost-diag.txt"
}

clock_ramp() {  # issue 31: how long an idle GPU takes to run at speed again (bench/clock_ramp.py; the timers' WARM_S):
  # a streaming kernel's and a small one's
  { timeout 100 python3 bench/clock_ramp.py ${RAMP_ARGS:-}; timeout 100 python3 bench/clock_ramp.py --mib 4 ${RAMP_ARGS:-}; } \
    > "$OUT/clock_ramp.txt" 2>&1
  echo "clock ramp: exit $?"; cat "$OUT/clock_ramp.txt" | tee -a "$OUT/eval_cost-diag.txt"
}

call_cost() {  # call_cost [PACKAGE] [ARGS...]: where one timed call's time goes, piece by piece (bench/call_cost.py)
  local pkg=${1:-$OURS}; shift || true
  timeout 200 python3 bench/call_cost.py "$pkg" "$@" > "$OUT/call_cost.tmp" 2>&1
  echo "call cost $(basename "$pkg") $*: exit $?"; cat "$OUT/call_cost.tmp" | tee -a "$OUT/eval_cost-calls.txt"
}

repeat_probe() {  # issue 31: one kernel's eager time across fresh processes, against the host probe (bench/repeat_probe.py)
  timeout "${REPEAT_TIMEOUT:-150}" python3 bench/repeat_probe.py ${REPEAT_ARGS:-} --json "$OUT/eval_cost-repeat.json" \
    > "$OUT/repeat_probe.txt" 2>&1
  echo "repeat probe: exit $?"; cat "$OUT/repeat_probe.txt" | tee -a "$OUT/eval_cost-diag.txt"
}

triton_compile() {  # triton_compile [KERNEL] [--modes ...]: a Triton kernel's first calls, compiles and launcher
  # builds apart, serially and with the specialisations compiled on threads after a dry pass (bench/triton_compile_cost.py)
  timeout "${TC_TIMEOUT:-240}" python3 bench/triton_compile_cost.py "$OURS" "$@" 2>&1 | tee -a "$OUT/eval_cost-compile.txt"
}

eval_profile() {  # issue 31: one evaluation's message timeline and its judge under cProfile (bench/eval_profile.py)
  timeout "${PROFILE_TIMEOUT:-300}" python3 bench/eval_profile.py ${PROFILE_ARGS:-} > "$OUT/eval_profile.txt" 2>&1
  echo "eval profile: exit $?"; head -${PROFILE_LINES:-70} "$OUT/eval_profile.txt"
}

case "$STAGE" in
  check) check_all ;;
  cost) eval_cost ;;
  run) decode_run; decode_tables ;;
  more) for m in $MORE; do pkg_run "$m" "${MORE_LIMIT:-120}"; done ;;
  lanes) lanes ;;
  variants) variants ;;
  steps) steps ;;
esac
finish
