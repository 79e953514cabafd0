#!/usr/bin/env bash
# Issue 23: optagent on packages it has never seen. For each package (default: those under
# tests/fixtures/packages, manifest-less, naive Triton starters and some CUDA ones), an offline `optagent run PKG`
# with no options (every starter timed, the fastest searched), and with LANGS="triton cuda" one run per language,
# each under UNSEEN_LIMIT seconds (default 480: the issue's 8 minutes). Prints per run: the language,
# the starter's and the best geomean time, the speedup, % of the estimated floor, candidates, wall time.
#
#   bash bench/unseen.sh                       # on the GPU machine, from the repository root
#   PKGS=tests/fixtures/packages/softmax LANGS="triton cuda" bash bench/unseen.sh  # one package, each language too
# A device command lasts 10 minutes at most: one package per call at the default limit.
#
# Like gpu_check.sh it installs .whl/ (py3.12 wheels) when present and writes under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/optagent-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
mkdir -p /tmp/site && ln -sfn "$PWD/agent" /tmp/site/optagent
# bubblewrap for the workers' isolation, from .debs/ (as gpu_check.sh): without it they run under unshare
if [ -d .debs ] && ! command -v bwrap > /dev/null; then dpkg -i .debs/*.deb > /dev/null 2>&1 || echo "bwrap: not installed"; fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
PKGS=${PKGS:-$(ls -d tests/fixtures/packages/*/)}
LANGS=${LANGS-}
LIMIT=${UNSEEN_LIMIT:-480}

one() {  # one NAME PKG [run options...]
  local name=$1 pkg=$2; shift 2
  local start; start=$(date +%s)
  OPTAGENT_RUNS_DIR="$OUT/runs-$name" timeout $(( LIMIT + 240 )) python3 -m optagent.cli.main run "$pkg" \
    --time-limit "$LIMIT" --json "$@" > "$OUT/$name.json" 2> "$OUT/$name.log"
  echo "$name: exit $? in $(( $(date +%s) - start )) s" >&2
  python3 - "$OUT/$name.json" "$name" "$(( $(date +%s) - start ))" <<'PY'
import json, math, pathlib, sys
path, name, wall = sys.argv[1:]
try:
    out = json.loads(pathlib.Path(path).read_text())
except (OSError, ValueError):
    print(f"{name:<28} no result (see {path[:-5]}.log)")
    sys.exit()
run = pathlib.Path(out["path"])
config = json.loads((run / "config.json").read_text())
first = json.loads((run / "steps" / "0000" / "result.json").read_text())
best = out.get("best") or first
pcts = [100 * c["floor_us"] / min(x for x in (c.get("time_us"), c.get("gpu_us")) if x)
        for c in best["cases"] if c.get("floor_us") and c.get("time_us") and c["kind"] != "hidden"]
def geomean_us(result: dict):  # EvalResult.geomean_time_us is a property: not in the JSON
    ts = [c["time_us"] for c in result.get("cases", []) if c["kind"] != "hidden" and c.get("time_us")]
    return math.exp(sum(map(math.log, ts)) / len(ts)) if ts and result.get("status") == "PASSED" else None
s, b = geomean_us(first), geomean_us(best)
floor = f"~{sum(pcts) / len(pcts):.0f}%" + (" est." if any(c.get("floor_kind") == "estimate" for c in best["cases"]) else "") if pcts else "-"
x = f"{s / b:.2f}x" if s and b else "-"
print(f"{name:<28} {config['language']:<7} {s or float('nan'):>10.1f} {b or float('nan'):>10.1f} {x:>7} {floor:>10} "
      f"{out['state']['steps']:>5} {wall:>6}s  {out['state']['status']}  ({config.get('language_reason') or ''})")
PY
}

printf "%-28s %-7s %10s %10s %7s %10s %5s %7s\n" run lang "starter us" "best us" x "% floor" cands wall | tee "$OUT/unseen.txt"
for pkg in $PKGS; do
  base=$(basename "$pkg")
  one "$base" "$pkg" | tee -a "$OUT/unseen.txt"
  for lang in $LANGS; do
    one "$base-$lang" "$pkg" --language "$lang" | tee -a "$OUT/unseen.txt"
  done
done
