#!/usr/bin/env bash
# The wheel as a user outside the checkout meets it (.ci/run starts this beside README's main job):
# a brand-new venv, the wheel installed non-editable, then task validate, eval on CPU, a replay run,
# and an LLM run against a local chat-completions server (.ci/chat_server.py), checked from the
# files the runs wrote.
# Usage: wheel.sh REPO WORK WHEEL PIN...   (PIN: README's torch/triton pins)
set -euo pipefail
REPO=$1 WORK=$2 WHEEL=$3
shift 3
SECONDS=${CI_SECONDS:-0}  # the step lines count from CI's start
SERVER_PID=""
trap '[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null' EXIT
step() { printf '\n== ci: %s (%ss)\n' "$1" "$SECONDS"; }
quiet_pip() { grep -v "^WARNING: Location" || true; }  # this machine's pip config names absent local indexes

step "wheel, installed non-editable into a second brand-new venv"
python3 -m venv "$WORK/user"
U="$WORK/user/bin"
"$U/python" -m pip install -q "$@" "$WHEEL" 2>&1 | quiet_pip
mkdir -p "$WORK/outside"
cp -r "$REPO/tasks/flashattn_task_package" "$WORK/pkg"
cd "$WORK/outside"
"$U/python" -c 'import optagent; assert "site-packages" in optagent.__file__, optagent.__file__; print("wheel:", optagent.__file__)'
"$U/optagent" task validate "$WORK/pkg"
"$U/optagent" eval "$WORK/pkg" "$WORK/pkg/starter/decode_triton.py" --device cpu

step "wheel: a replay run"
"$U/optagent" run "$WORK/pkg" --device cpu --planner replay --replay "$REPO/tests/fixtures/replay_decode.jsonl" \
    --runs-dir "$WORK/outside/runs-replay"

step "wheel: an LLM run against a local chat-completions server"
"$U/python" "$REPO/.ci/chat_server.py" "$REPO/tests/fixtures/replay_decode.jsonl" "$WORK/chat" &
SERVER_PID=$!
for _ in $(seq 50); do [ -s "$WORK/chat/port" ] && break; sleep 0.2; done
PORT=$(cat "$WORK/chat/port")
OPTAGENT_API_KEY=ci-not-a-secret "$U/optagent" run "$WORK/pkg" --device cpu --planner llm \
    --base-url "http://127.0.0.1:$PORT/v1" --model ci --max-steps 3 --runs-dir "$WORK/outside/runs-llm"
"$U/optagent" runs --runs-dir "$WORK/outside/runs-llm"
RUN=$(basename "$(dirname "$(ls "$WORK"/outside/runs-llm/*/config.json)")")  # the run, not ledger/
"$U/optagent" show "$RUN" --runs-dir "$WORK/outside/runs-llm"
"$U/optagent" report "$RUN" --runs-dir "$WORK/outside/runs-llm" -o "$WORK/outside/report.html"
# What the LLM planner sent and what the runs recorded, checked from the files themselves.
"$U/python" - "$WORK" <<'EOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
requests = sorted((work / "chat" / "requests").glob("*.json"))
assert requests, "the LLM planner sent no request"
messages = json.loads(requests[0].read_text())["messages"]
assert messages[0]["role"] == "system" and len(messages[0]["content"]) > 200, "no rendered system prompt"
assert "def run_kernel" in messages[-1]["content"], "the user prompt lacks the kernel"
for runs in ("runs-replay", "runs-llm"):
    (run,) = [p for p in (work / "outside" / runs).iterdir() if (p / "config.json").is_file()]
    steps = [json.loads(p.read_text()) for p in sorted(run.glob("steps/*/step.json"))]
    passed = [s["index"] for s in steps if s.get("result") and s["result"]["status"] == "PASSED"]
    assert 0 in passed and len(passed) >= 2, f"{run}: passed steps {passed} of {len(steps)}"
    print(f"{runs}: {len(steps)} steps, PASSED: {passed}")
assert (work / "outside" / "report.html").stat().st_size > 10_000, "report too small"
print(f"llm: {len(requests)} requests")
EOF
