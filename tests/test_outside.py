"""Outside agents: `optagent mcp` driven through the MCP SDK's own stdio client, and the step mode.

Both on the tiny package (one smoke and one hidden case: seconds per evaluation on CPU), with
real sandboxed evaluations behind every tool call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_package import FAST, NAIVE, tiny_package

mcp = pytest.importorskip("mcp")

BROKEN = NAIVE.replace("tl.store(", "tl.stor(")
WRONG = FAST.replace("* 2.0 + 1.0", "* 2.0 + 1.5")


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTAGENT_", "OPENAI_"))}
    env["OPTAGENT_SCRATCH"] = str(tmp_path / "scratch")
    env["OPTAGENT_CACHE"] = str(tmp_path / "cache")
    return env


def test_mcp_server_drives_a_run(tmp_path):
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    pkg = tiny_package(tmp_path / "pkg")
    runs = tmp_path / "runs"
    params = StdioServerParameters(command=sys.executable, args=["-m", "optagent", "mcp", "--task", str(pkg),
                                                                  "--device", "cpu", "--runs-dir", str(runs)],
                                   env=_env(tmp_path))
    progress_seen: list[str] = []

    async def on_progress(progress, total, message):
        progress_seen.append(message or "")

    async def scenario() -> dict:
        out: dict = {}
        with open(tmp_path / "server.err", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    tools = await s.list_tools()
                    out["tools"] = {t.name: t for t in tools.tools}
                    call = lambda name, args, **kw: s.call_tool(name, args, read_timeout_seconds=600, **kw)  # noqa: E731
                    out["info"] = await call("task_info", {"task": "tiny_affine"})
                    out["starter"] = await call("evaluate", {"task": "tiny_affine", "source": NAIVE},
                                                progress_callback=on_progress)
                    out["broken"] = await call("evaluate", {"task": "tiny_affine", "source": BROKEN})
                    out["bad_task"] = await call("evaluate", {"task": "nope", "source": NAIVE})
                    out["start"] = await call("start_run", {"task": "tiny_affine"})
                    run_id = out["start"].structured_content["run_id"]
                    out["round1"] = await call("propose", {"run_id": run_id, "sources": [FAST, WRONG],
                                                           "ideas": ["one program per 4096", "off by 0.5"]})
                    out["round2"] = await call("propose", {"run_id": run_id, "sources": [BROKEN]})
                    out["status"] = await call("run_status", {"run_id": run_id})
                    out["board"] = await call("leaderboard", {})
                    out["export"] = await call("export", {"run_id": run_id})
        return out

    out = anyio.run(scenario)
    assert {"task_info", "evaluate", "start_run", "propose", "run_status", "leaderboard", "export"} <= set(out["tools"])
    schema = out["tools"]["evaluate"].input_schema
    assert set(schema["required"]) == {"task", "source"} and "description" in schema["properties"]["source"]
    info = out["info"].structured_content
    assert info["name"] == "tiny_affine" and info["outputs"] == [1] and "run_kernel" in info["starters"][0]["source"]
    starter = out["starter"].structured_content
    assert not out["starter"].is_error and starter["status"] == "PASSED", starter
    assert "smoke-1" in starter["table"]
    assert progress_seen, "evaluate sent no progress notification"
    broken = out["broken"].structured_content
    assert broken["status"] == "COMPILE_ERROR" and "stor" in broken["reason"]
    assert out["bad_task"].is_error and "not one this server offers" in out["bad_task"].content[0].text
    start = out["start"].structured_content
    assert start["status"] == "WAITING" and [s["outcome"] for s in start["steps"]] == ["BASELINE"]
    r1 = out["round1"].structured_content
    assert [(s["index"], s["status"]) for s in r1["steps"]] == [(1, "PASSED"), (2, "INCORRECT")], r1["steps"]
    assert "off by 0.5" in r1["next_prompt"]  # the failure is in what a planner is shown next
    r2 = out["round2"].structured_content
    assert [s["status"] for s in r2["steps"]] == ["COMPILE_ERROR"]
    status = out["status"].structured_content
    assert [s["index"] for s in status["steps"]] == [0, 1, 2, 3]
    assert status["lineage"][0]["index"] == 0 and status["lineage"][-1]["index"] == status["best_step"]
    assert status["best_source"] in (NAIVE, FAST)
    board = out["board"].structured_content
    assert [r["run_id"] for r in board["rows"]] == [start["run_id"]]
    exported = out["export"].structured_content
    assert Path(exported["file"]).read_text() == status["best_source"]
    assert Path(exported["file"]).is_relative_to(runs)


def _oa(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optagent.cli.main", *args, "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, env=_env(tmp_path), timeout=900)


def test_step_mode_drives_a_run(tmp_path):
    pkg = tiny_package(tmp_path / "pkg")
    fast, wrong = tmp_path / "fast.py", tmp_path / "wrong.py"
    fast.write_text(FAST)
    wrong.write_text(WRONG)
    # --max-steps 3: the offline planner that takes the run over below has one step left
    started = _oa(tmp_path, "run", str(pkg), "--device", "cpu", "--planner", "external", "--max-steps", "3", "--json")
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    assert json.loads(started.stdout)["state"]["status"] == "WAITING"
    round1 = _oa(tmp_path, "propose", run_id, str(fast), str(wrong), "--idea", "wide", "--idea", "wrong", "--json")
    assert round1.returncode == 0, round1.stderr
    fb = json.loads(round1.stdout)
    assert [s["status"] for s in fb["steps"]] == ["PASSED", "INCORRECT"]
    assert fb["status"] == "WAITING" and "# Task" in fb["next_prompt"]
    assert "a kernel is accepted on correctness alone" in fb["next_prompt"]  # the rules an LLM planner is told, told here too
    again = _oa(tmp_path, "feedback", run_id, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["next_prompt"] == fb["next_prompt"]
    missing = _oa(tmp_path, "propose", run_id, str(tmp_path / "absent.py"))
    assert missing.returncode == 2 and "absent.py: no such kernel file" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    # an ordinary run: show reads it, and the offline planner can take it over
    shown = _oa(tmp_path, "show", run_id)
    assert shown.returncode == 0 and "wrong" in shown.stdout
    handed = _oa(tmp_path, "resume", run_id, "--planner", "offline")
    assert handed.returncode == 0, handed.stderr
    cfg = json.loads((tmp_path / "runs" / run_id / "config.json").read_text())
    assert cfg["planner"] == "offline"
    assert len(list((tmp_path / "runs" / run_id / "steps").glob("*/step.json"))) == 4  # its one step, taken
    refused = _oa(tmp_path, "propose", run_id, str(fast))
    assert refused.returncode == 2 and "driven by the offline planner" in refused.stderr


def test_moved_run_needs_its_package(tmp_path):
    pkg = tiny_package(tmp_path / "pkg")
    started = _oa(tmp_path, "run", str(pkg), "--device", "cpu", "--planner", "external", "--json")
    run_id = json.loads(started.stdout)["run_id"]
    moved = pkg.rename(tmp_path / "elsewhere")
    lost = _oa(tmp_path, "feedback", run_id)
    assert lost.returncode == 2 and "is not here (pass --task DIR)" in lost.stderr
    found = _oa(tmp_path, "feedback", run_id, "--task", str(moved), "--json")
    assert found.returncode == 0, found.stderr
    (moved / "starter" / "naive.py").write_text(NAIVE + "\n# changed\n")
    changed = _oa(tmp_path, "feedback", run_id, "--task", str(moved))
    assert changed.returncode == 2 and "changed since run" in changed.stderr
