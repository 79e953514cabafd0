"""The HTML run report and leaderboard: content, self-containment, and a real browser's view of them.

The recorded run in fixtures/run_sample/ (made by fixtures/make_run_sample.py) has twelve steps with every
outcome: the starter, accepted and not-better candidates, incorrect, compile error, rejected, timeout,
runtime error, and a reply with no kernel.
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from markupsafe import escape

from optagent.report import code as report_code
from optagent.report import svg
from optagent.report.leaderboard import gather
from optagent.cli.report import add_report_commands
from optagent.report.run_page import render_run_report
from optagent.report.board_page import render_leaderboard, write_leaderboard_html
from optagent.report.charts import case_chart, step_category
from optagent.report.svg import linear_ticks, log_ticks, marker_path
from optagent.schema import (
    CaseKind,
    CaseResult,
    EvalResult,
    Language,
    Proposal,
    RunConfig,
    RunState,
    RunStatus,
    Status,
    Step,
    StepOutcome,
    Timing,
    Usage,
)
from optagent.runs.store import RunStore
from optagent.runs.files import RunError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run_sample"
RUN_ID = "20260721-093012-flashattn_decode-3f9a2c"
CONTEST_CASES = 12


@pytest.fixture(scope="module")
def store() -> RunStore:
    return RunStore.open(FIXTURES, RUN_ID)


@pytest.fixture(scope="module")
def page(store) -> str:
    return render_run_report(store)


def count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


def external_refs(text: str) -> list[str]:
    """Everything in a page that would make a browser fetch something."""
    refs = re.findall(r"""\b(?:src|href|xlink:href|action|poster|srcset)\s*=\s*["']?\s*((?:https?:|ftp:|//)[^"'\s>]*)""",
                      text, flags=re.I)
    refs += re.findall(r"url\(\s*['\"]?\s*((?:https?:|//)[^)'\"]*)", text, flags=re.I)
    refs += re.findall(r"@import[^;]*", text, flags=re.I)
    refs += re.findall(r"<link\b[^>]*>", text, flags=re.I)
    refs += re.findall(r"<(?:script|img|iframe|object|embed)\b[^>]*\bsrc\s*=[^>]*>", text, flags=re.I)
    return refs


# ---------------------------------------------------------------- the fixture itself


def test_fixture_is_a_valid_recorded_run(store):
    steps = store.steps()
    assert [s.index for s in steps] == list(range(12))
    outcomes = {s.outcome for s in steps}
    # a GPU run from before rounds: no CPU node (PASSED), and PENDING is never a step's last word
    assert outcomes == set(StepOutcome) - {StepOutcome.PASSED, StepOutcome.PENDING}
    statuses = {s.result.status for s in steps if s.result}
    assert {Status.PASSED, Status.INCORRECT, Status.COMPILE_ERROR, Status.REJECTED, Status.TIMEOUT,
            Status.RUNTIME_ERROR} <= statuses
    best = store.best()
    assert best is not None and best[1].geomean_speedup == pytest.approx(store.state().best_geomean_speedup)
    assert best[1].device_name == "NVIDIA H200"
    assert store.config.planner == "llm"
    assert (store.path / "best" / "diff.patch").read_text().startswith("--- starter.py")
    no_kernel = next(s for s in steps if s.outcome is StepOutcome.NO_KERNEL)
    assert store.proposal(no_kernel.index).error and store.step_source(no_kernel.index) is None


# ---------------------------------------------------------------- run report content


def test_report_names_the_task_planner_model_device_and_cost(page, store):
    cfg = store.config
    assert "<!DOCTYPE html>" in page
    assert cfg.task_name in page and cfg.run_id in page
    assert ">llm<" in page and cfg.model in page
    assert "NVIDIA H200" in page
    assert "flash_attn (optagent PyTorch stand-in)" in page
    state = store.state()
    assert f"${state.usage.cost_usd:.2f}" in page
    assert f"{state.usage.prompt_tokens + state.usage.completion_tokens:,}" in page
    assert "1.92x" in page  # the best geomean speedup
    assert "MAX_STEPS" in page


def test_ledger_lists_every_idea_with_its_outcome(page, store):
    steps = store.steps()
    assert count(r'<tr class="step', page) == len(steps)
    for s in steps:
        assert str(escape(s.idea)) in page, s.idea
        assert f'id="step-{s.index}"' in page
    assert "re-timed back to back" in page  # an accepted step's retime note
    assert "AssertionError(" in page  # the compile error's verdict line, not just its "at 71:12:"
    assert "illegal memory access" in page
    assert "below the physical floor" in page
    assert "SEARCH block 2 does not match" in page  # the NO_KERNEL step's reason
    assert '<tr class="step best" id="step-9">' in page


def test_step_chart_has_a_marker_per_step_shaped_by_outcome(page, store):
    steps = store.steps()
    svg = re.search(r'<svg class="chart steps".*?</svg>', page, flags=re.S).group()
    markers = re.findall(r'<path class="marker (\w+)" data-step="(\d+)"', svg)
    assert [int(i) for _, i in markers] == [s.index for s in steps]
    kinds = {k for k, _ in markers}
    assert kinds == {"baseline", "accepted", "passed", "incorrect", "compile_error", "runtime_error", "timeout",
                     "rejected", "no_kernel"}
    for s, (kind, _) in zip(steps, markers):
        assert kind == step_category(s).key
    assert 'class="bestline"' in svg
    assert "<title>step 3: FAILED, COMPILE_ERROR" in svg  # tooltips
    # a legend entry for every kind of marker drawn
    for label in ("passed, new best", "incorrect", "compile error", "timeout", "rejected (integrity)",
                  "runtime error", "no kernel in reply"):
        assert f">{label}</text>" in svg


def test_case_chart_has_three_bars_per_contest_case(page):
    svg = re.search(r'<svg class="chart cases".*?</svg>', page, flags=re.S).group()
    assert count(r'class="bar best-kernel"', svg) == CONTEST_CASES
    assert count(r'class="bar baseline"', svg) == CONTEST_CASES
    assert count(r'class="bar hardware-floor"', svg) == CONTEST_CASES
    assert count(r'<g class="group" data-case="', svg) == CONTEST_CASES
    assert "hidden-" not in svg  # integrity cases are listed in the table, not charted
    assert "(log scale)" in svg  # 1 us floors to 600 us baselines
    assert "bs=16 seqlen=16384" in page


def test_best_kernel_is_highlighted_and_diffed(page, store):
    assert '<span class="k">def</span>' in page
    assert re.search(r'<span class="(c1|c)">#', page)  # a highlighted comment
    assert count(r'<tr class="add">', page) > 5 and count(r'<tr class="del">', page) > 5
    assert "+BLOCK_N = 64  # knob: 16, 32, 64, 128" in html.unescape(page)
    assert "-BLOCK_N = 16  # knob: 16, 32, 64" in html.unescape(page)
    assert "_merge_kernel" in page


def test_report_is_self_contained(page):
    assert external_refs(page) == []
    assert "https://" not in page
    # the only http:// is the run's own LLM endpoint, shown as text
    assert re.findall(r"http://[^\s<\"')]*", page) == ["http://127.0.0.1:8000/v1"]


def test_report_escapes_recorded_text(tmp_path):
    store = _make_run(tmp_path, [("PASSED", "<script>alert(1)</script> & co")])
    page = render_run_report(store)
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page


def test_fallback_highlighter_without_pygments(monkeypatch, store):
    monkeypatch.setattr(report_code, "USE_PYGMENTS", False)
    lines = report_code.highlight_lines(store.best()[0], Language.TRITON)
    assert len(lines) == len(store.best()[0].splitlines())
    joined = "\n".join(lines)
    assert '<span class="k">def</span>' in joined
    assert '<span class="nd">@triton.jit</span>' in joined
    assert '<span class="c1"># knob: 16, 32, 64, 128</span>' in joined
    assert '<span class="sd">&quot;&quot;&quot;Paged' in joined
    for line in lines:  # every line stands alone: spans never cross a line end
        assert line.count("<span") == line.count("</span>")
    page = render_run_report(store)
    assert report_code.FALLBACK_CSS.splitlines()[0] in page
    cuda = report_code.highlight_lines('#include <cuda.h>\n__global__ void k(float* x) { // c\n  x[0] = 1.0f; }\n',
                                  Language.CUDA)
    assert '<span class="cp">#include &lt;cuda.h&gt;</span>' in cuda[0]
    assert '<span class="k">__global__</span>' in cuda[1] and '<span class="c1">// c</span>' in cuda[1]


# ---------------------------------------------------------------- other runs


def _result(status: str, device: str = "cuda", time_us: float = 20.0, kind: str = "cuda") -> EvalResult:
    ok = status == "PASSED"
    cases = [CaseResult(case=str(i), kind=CaseKind.CONTEST if device == "cuda" else CaseKind.SMOKE,
                        status=Status.PASSED if ok else Status(status), reason=None if ok else "broken",
                        sizes=f"n={1024 * i}", time_us=time_us * i if ok else None,
                        baseline_us=30.0 * i if ok else None,
                        time=Timing(median_us=time_us * i, p10_us=time_us * i, p90_us=time_us * i, samples=3)
                        if ok else None, timing_kind=kind)
             for i in (1, 2)]
    return EvalResult(status=Status(status), reason=None if ok else "case 1: broken\nTraceback line\nValueError: x",
                      language=Language.TRITON, device=device, source_sha256="0" * 64, cases=cases, wall_s=1.0)


def _make_run(root: Path, plan: list[tuple[str, str]], device: str = "cuda", kind: str = "cuda") -> RunStore:
    """A run whose steps have the given (status or NO_KERNEL, idea), recorded the way the loop records them."""
    cfg = RunConfig(run_id="20260101-000000-toy-abcdef", task_dir="/nowhere", task_name="toy", task_digest="x",
                    language=Language.TRITON, device=device, planner="offline", timeout_s=60, min_gain=0.01,
                    patience=3, max_steps=len(plan), created_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    starter = "import triton\n\n\n@triton.jit\ndef k(x):\n    pass  # starter\n"
    store = RunStore.create(root, cfg, starter)
    t = cfg.created_at
    best = None
    for i, (status, idea) in enumerate(plan):
        source = starter.replace("starter", f"step {i}")
        if status == "NO_KERNEL":
            store.save_proposal(i, Proposal(idea=idea, error="no code block in the reply"), cfg.language)
            step = Step(index=i, started_at=t, finished_at=t + timedelta(seconds=5), idea=idea,
                        outcome=StepOutcome.NO_KERNEL, error="no code block in the reply")
        else:
            store.save_proposal(i, Proposal(idea=idea, source=source, usage=Usage(prompt_tokens=10)), cfg.language)
            r = _result(status, device, kind=kind)
            if r.status.ok:
                outcome = StepOutcome.BASELINE if best is None else StepOutcome.ACCEPTED
                store.save_best(source, r)
                best = r
            else:
                outcome = StepOutcome.FAILED
            step = Step(index=i, started_at=t, finished_at=t + timedelta(seconds=5), idea=idea, outcome=outcome,
                        result=r, error=r.reason, best_geomean_speedup=best.geomean_speedup if best else None)
        store.save_step(step)
        t += timedelta(seconds=10)
    store.save_state(RunState(status=RunStatus.CONVERGED, steps=len(plan)))
    return store


def test_report_of_a_run_where_nothing_passed(tmp_path):
    store = _make_run(tmp_path, [("COMPILE_ERROR", "the starter kernel"), ("NO_KERNEL", "try again"),
                                 ("TIMEOUT", "spin")])
    page = render_run_report(store)
    assert "No kernel passed, so there are no timings to chart." in page
    assert "The starter kernel (no candidate passed)" in page
    assert "# starter" in html.unescape(re.sub(r"<[^>]+>", "", page))
    assert count(r'<path class="marker', page) == 3
    assert 'class="bar' not in page
    assert "Diff against the starter" not in page
    assert external_refs(page) == []


def test_report_of_a_run_with_no_finished_step(tmp_path):
    store = _make_run(tmp_path, [])
    store.save_proposal(0, Proposal(idea="the starter kernel", source="x = 1\n"), Language.TRITON)
    page = render_run_report(store)
    assert "No step has finished yet." in page
    assert "step 0 was proposed (the starter kernel) but its evaluation never finished" in page


def test_cpu_interpreter_timings_are_marked(tmp_path):
    store = _make_run(tmp_path, [("PASSED", "the starter kernel"), ("INCORRECT", "oops")], device="cpu",
                      kind="cpu-interpreter")
    page = render_run_report(store)
    assert 'id="cpu-note"' in page and "Triton's interpreter" in page
    assert "µs (CPU interpreter)" in page
    svg = re.search(r'<svg class="chart cases".*?</svg>', page, flags=re.S).group()
    assert "CPU interpreter" in svg
    gpu_page = render_run_report(RunStore.open(FIXTURES, RUN_ID))
    assert 'id="cpu-note"' not in gpu_page and "µs (CPU interpreter)" not in gpu_page


# ---------------------------------------------------------------- chart helpers


def test_ticks_and_scales():
    assert linear_ticks(0, 2.5) == [0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert log_ticks(0.5, 1000) == [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    assert log_ticks(1e-3, 1e6) == [1e-3, 1e-2, 1e-1, 1, 10, 100, 1e3, 1e4, 1e5, 1e6]
    assert svg.log_floor(1.02) == 0.5 and svg.log_floor(13.0) == 5
    for shape in ("circle", "ring", "diamond", "square", "triangle", "triangle_down", "octagon", "cross", "plus"):
        assert re.fullmatch(r"M[-\d.,aLZ ]+Z|M[-\d.,]+a[-\d., ]+a[-\d., ]+Z", marker_path(shape, 10, 10, 5)), shape


def test_case_chart_is_linear_when_the_range_is_narrow():
    chart = case_chart(_result("PASSED"), cpu=False)
    assert not chart.log and len(chart.groups) == 2
    assert all(len(g.bars) == 2 for g in chart.groups)  # no floor known: no floor bar
    assert [item["label"] for item in chart.legend] == ["best kernel", "baseline"]


# ---------------------------------------------------------------- leaderboard


def test_leaderboard_html(tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(FIXTURES, root)
    _make_run(root, [("PASSED", "the starter kernel")])
    entries = gather(root)
    assert len(entries) == 2
    out = write_leaderboard_html(entries, tmp_path / "board" / "lb.html")
    page = out.read_text()
    assert RUN_ID in page and "20260101-000000-toy-abcdef" in page
    assert "flashattn_decode" in page and "toy" in page
    assert count(r'<svg class="chart board"', page) == 2  # one chart per task and device
    assert count(r'<rect class="bar"', page) == 2
    assert "1.92x" in page
    assert count(r'<tr class="add">', page) > 5
    assert external_refs(page) == []
    assert "No run has a passing kernel yet." in render_leaderboard([])


# ---------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="optagent")
    add_report_commands(p.add_subparsers(dest="command", required=True))
    return p


def test_report_command_writes_the_file(tmp_path, capsys):
    out = tmp_path / "out" / "report.html"
    a = _parser().parse_args(["report", "3f9a2c", "--runs-dir", str(FIXTURES), "-o", str(out)])
    assert a.fn(a) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {out} (") and RUN_ID in said

    a = _parser().parse_args(["report", RUN_ID, "--runs-dir", str(FIXTURES), "-o", "-"])
    assert a.fn(a) == 0
    said = capsys.readouterr().out  # the page and nothing else
    assert said.startswith("<!DOCTYPE html>") and said.rstrip().endswith("</html>") and "wrote" not in said[-200:]

    a = _parser().parse_args(["report", RUN_ID, "--runs-dir", str(FIXTURES), "-o", str(tmp_path), "--quiet"])
    assert a.fn(a) == 0 and (tmp_path / f"{RUN_ID}.html").is_file()
    assert capsys.readouterr().out == ""

    a = _parser().parse_args(["report", "no-such-run", "--runs-dir", str(FIXTURES)])
    with pytest.raises(RunError, match="no such run"):
        a.fn(a)


# ---------------------------------------------------------------- in a real browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(tmp_path: Path, url: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--window-size=1400,2400", *extra, url],
        capture_output=True, text=True, timeout=120)


def _console(stderr: str) -> list[str]:
    # With --enable-logging=stderr every console message (log, warning, error, uncaught exception) is a
    # "...:CONSOLE:..." line, whatever its level; the report logs nothing, so any such line is a fault.
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (install it with .ci/chromium.sh)")
@pytest.mark.parametrize("which", ["run", "leaderboard"])
def test_report_in_headless_chromium(tmp_path, store, which):
    target = tmp_path / f"{which}.html"
    if which == "run":
        target.write_text(render_run_report(store), encoding="utf-8")
        markers, charts = len(store.steps()), 2
    else:
        write_leaderboard_html(gather(FIXTURES), target)
        markers, charts = 0, 1
    url = target.as_uri()

    dom = _chromium(tmp_path, url, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console(dom.stderr) == []
    body = re.search(r"<body[^>]*>", dom.stdout).group()
    # the page's own check: every chart and every marker/bar in it laid out with a non-zero size
    assert f'data-charts="{charts}"' in body and f'data-charts-drawn="{charts}"' in body, body
    assert "data-js-error" not in re.search(r"<html[^>]*>", dom.stdout).group()
    assert count(r'<path class="marker ', dom.stdout) == markers
    assert count(r"<svg class=\"chart", dom.stdout) == charts

    shot = tmp_path / "shot.png"  # kept out of the repo: pytest's tmp dir
    png = _chromium(tmp_path, url, f"--screenshot={shot}")
    assert png.returncode == 0, png.stderr[-2000:]
    assert _console(png.stderr) == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a drawn page, not a blank one
