"""--profile through the real CLI on the CPU: a fake ncu (tests/fake_ncu.py) runs the profile worker inside
the sandbox and writes a raw page in ncu's format; the parsed record reaches the run's records, ``show``
and the prompt. A garbled page, counters that cannot be read and a missing ncu give a status (said once),
never a failed run. On a GPU with Nsight Compute, the decode Triton starter is profiled for real."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from fake_ncu import write_fake_ncu
from test_llm_planner import make_ctx
from tiny_package import FAST, tiny_package

from optagent.cli.main import main
from optagent.report.format import print_eval, profile_lines
from optagent.evaluation import isolation, profiler
from optagent.profile_facts import Bound, CaseProfile, ProfiledKernel, ProfileStatus, Stall
from optagent.schema import CaseKind, CaseResult, EvalResult, FloorKind, Language, Mechanism, Status
from optagent.worker.compiler_facts import from_triton
from optagent.search.planners.llm import build_messages
from optagent.runs.store import RunStore

NOT_FOUND_LINE = "profile: ncu (Nsight Compute) was not found"
MACHINE_PATH, MACHINE_PLACES = os.environ.get("PATH", ""), profiler.PLACES


@pytest.fixture
def pkg(tmp_path: Path) -> Path:
    return tiny_package(tmp_path / "pkg")


@pytest.fixture(autouse=True)
def _no_ncu_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the ncu a test provides: none from this machine's PATH or CUDA folders."""
    monkeypatch.delenv(profiler.NCU_ENV, raising=False)
    monkeypatch.setattr(profiler, "PLACES", ())
    kept = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "ncu").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(kept))


def _run_dir(runs: Path) -> Path:
    (run,) = [p for p in runs.iterdir() if (p / "config.json").is_file()]
    return run


def test_a_run_profiles_its_kernel_in_the_sandbox_and_show_and_the_prompt_tell_it(
        tmp_path: Path, pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    fake = write_fake_ncu(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")  # found on PATH
    runs = tmp_path / "runs"
    code = main(["run", str(pkg), "--device", "cpu", "--planner", "offline", "--max-steps", "0", "--profile",
                 "--runs-dir", str(runs)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"profile: each passing candidate runs once more per case under {fake}" in out
    store = RunStore.open(runs, _run_dir(runs).name)
    assert store.config.profile  # recorded: resume profiles too
    (step,) = store.steps()
    smoke, hidden = step.result.cases
    assert hidden.profile is None  # a hidden case is never profiled
    p = smoke.profile
    assert p.status is ProfileStatus.PROFILED and p.kernel_count == 1
    (kernel,) = p.kernels
    if isolation.mechanism() is Mechanism.BWRAP:
        assert kernel.name == "_affine_uid65534"  # ncu and its target ran as the sandbox's nobody
    assert kernel.duration_us == pytest.approx(156.864)
    assert (p.dram_pct, p.sm_pct, p.occupancy_pct, p.bound) == (81.5, 22.1, 37.0, Bound.MEMORY)
    assert [(s.reason, round(s.share, 2)) for s in p.stalls] == [("long_scoreboard", 0.72), ("wait", 0.16),
                                                               ("barrier", 0.08)]
    assert step.result.costs.profile > 0

    line = ("ncu case smoke-1: memory-bound: DRAM 82% SM 22% of peak; occupancy 37%; stalls long_scoreboard 72%, "
            "wait 16%, barrier 8%; 1 launch: _affine_")
    for argv in (["show", str(store.path)], ["show", str(store.path), "--step", "0"]):
        assert main(argv + ["--runs-dir", str(runs)]) == 0
        assert line in capsys.readouterr().out

    ctx = make_ctx()
    ctx.best_result = EvalResult.model_validate(step.result.model_dump())
    prompt = build_messages(ctx)[1]["content"]
    assert "What Nsight Compute measured" in prompt
    assert ("- case smoke-1: memory-bound, DRAM 82%, SM 22% of peak; achieved occupancy 37%; top stalls: "
            "long_scoreboard 72%, wait 16%, barrier 8%; 1 kernel launch: _affine_") in prompt
    assert "hidden-1" not in prompt.split("What Nsight Compute measured")[1].split("\n\n")[0]


def test_a_garbled_page_is_a_profile_status_and_the_kernel_still_passes(
        tmp_path: Path, pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv(profiler.NCU_ENV, str(write_fake_ncu(tmp_path / "bin", "garbled")))
    code = main(["eval", str(pkg), str(pkg / "starter" / "naive.py"), "--device", "cpu", "--no-hidden", "--profile",
                 "--json"])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert code == 0 and doc["status"] == "PASSED"
    (case,) = doc["cases"]
    assert case["profile"]["status"] == "FAILED" and "units row" in case["profile"]["reason"]
    assert "ncu case smoke-1: FAILED: ncu's CSV has no units row under its header" in captured.err


def test_without_ncu_a_run_says_so_once_and_records_it(tmp_path: Path, pkg: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "runs"
    code = main(["run", str(pkg), "--device", "cpu", "--planner", "offline", "--max-steps", "0", "--no-hidden",
                 "--profile", "--runs-dir", str(runs)])
    out = capsys.readouterr().out
    assert code == 0 and out.count(NOT_FOUND_LINE) == 1
    (step,) = RunStore.open(runs, _run_dir(runs).name).steps()
    (case,) = step.result.cases
    assert case.profile.status is ProfileStatus.NO_NCU and case.profile.reason == profiler.NOT_FOUND
    assert step.result.costs.profile < 1.0  # nothing ran


def _decode_result(profile: CaseProfile, other: CaseProfile) -> EvalResult:
    facts = [from_triton({"name": "_decode", "n_regs": 96, "n_spills": 0, "shared": 4096, "num_warps": 4})]
    cases = [CaseResult(case=str(n), kind=CaseKind.CONTEST, status=Status.PASSED, time_us=50.0, baseline_us=80.0,
                        floor_us=32.0, floor_kind=FloorKind.HOOK, kernels=facts, profile=p)
             for n, p in ((1, profile), (2, other))]
    return EvalResult(status=Status.PASSED, language=Language.TRITON, device="cuda", source_sha256="0" * 64,
                      cases=cases, wall_s=1.0)


def test_show_prints_the_compiler_and_ncu_lines_of_a_gpu_result() -> None:
    p = CaseProfile(status=ProfileStatus.PROFILED, kernels=[ProfiledKernel(name="_decode", duration_us=48.0),
                                                            ProfiledKernel(name="_combine", duration_us=2.0)],
                    kernel_count=2, duration_us=50.0, dram_pct=81.0, sm_pct=22.0, occupancy_pct=31.0,
                    stalls=[Stall(reason="long_scoreboard", share=0.55)], bound=Bound.MEMORY, floor_pct=64.0)
    failed = CaseProfile(status=ProfileStatus.FAILED, reason="ncu's CSV has no units row under its header")
    con = Console(record=True, width=300)
    print_eval(con, _decode_result(p, failed))
    text = con.export_text()
    assert "compiler: _decode (triton): 96 registers, 0 B spilled, 4.0 KiB shared, 4 warps" in text
    assert ("ncu case 1: memory-bound: DRAM 81% SM 22% of peak, 64% of floor (memory); occupancy 31%; stalls "
            "long_scoreboard 55%; 2 launches: _decode 48.0 us, _combine 2.0 us") in text
    assert "ncu case 2: FAILED: ncu's CSV has no units row under its header" in text
    none = CaseProfile(status=ProfileStatus.NO_NCU, reason=profiler.NOT_FOUND)
    assert profile_lines(_decode_result(none, none)) == [f"ncu: NO_NCU: {profiler.NOT_FOUND}"]  # once, not per case


REPLY = "IDEA: one program per 4096 elements\n\n```python\n" + FAST + "```\n"


def test_counters_that_cannot_be_read_are_said_once_and_not_asked_again(
        tmp_path: Path, pkg: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("OPTAGENT_ISOLATION", "none")  # so that the fake can count its calls in tmp_path
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv(profiler.NCU_ENV, str(write_fake_ncu(tmp_path / "bin", "no_counters", calls)))
    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"reply": REPLY}) + "\n")
    runs = tmp_path / "runs"
    code = main(["run", str(pkg), "--device", "cpu", "--planner", "replay", "--replay", str(replay), "--max-steps", "1",
                 "--no-hidden", "--profile", "--runs-dir", str(runs)])
    out = capsys.readouterr().out
    assert code == 0, out
    steps = RunStore.open(runs, _run_dir(runs).name).steps()
    assert [s.result.status.value for s in steps] == ["PASSED", "PASSED"]
    assert {s.result.cases[0].profile.status for s in steps} == {ProfileStatus.NO_COUNTERS}
    assert "ERR_NVGPUCTRPERM" in steps[1].result.cases[0].profile.reason
    assert calls.read_text().count("called") == 1  # the second kernel was not profiled again
    assert out.count("profile: ncu cannot read the GPU's counters here (ERR_NVGPUCTRPERM") == 1


def test_a_bad_OPTAGENT_NCU_is_a_one_line_error(tmp_path: Path, pkg: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv(profiler.NCU_ENV, str(tmp_path / "no-such-ncu"))
    code = main(["eval", str(pkg), str(pkg / "starter" / "naive.py"), "--device", "cpu", "--profile"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"optagent: error: {profiler.NCU_ENV}={str(tmp_path / 'no-such-ncu')!r}: " \
                                "not an executable file"
    assert main(["eval", str(pkg), str(pkg / "starter" / "naive.py"), "--device", "cpu", "--no-hidden",
                 "--quiet"]) == 0  # without --profile the variable is never read


@pytest.mark.gpu
def test_the_decode_triton_starter_is_profiled_by_the_real_ncu(task_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("PATH", MACHINE_PATH)  # this machine's own ncu
    monkeypatch.setattr(profiler, "PLACES", MACHINE_PLACES)
    ncu = profiler.find_ncu()
    if ncu is None:
        pytest.skip("Nsight Compute (ncu) is not installed here")
    starter = task_dir / "starter" / "decode_triton.py"
    code = main(["eval", str(task_dir), str(starter), "--device", "cuda", "--cases", "1", "--no-hidden", "--profile",
                 "--json"])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert code == 0 and doc["status"] == "PASSED", captured.err
    (case,) = doc["cases"]
    p = case["profile"]
    assert p["status"] == "PROFILED", p
    assert p["kernel_count"] >= 1 and p["dram_pct"] is not None and p["sm_pct"] is not None and p["stalls"]
    assert all("spin_kernel" not in k["name"] for k in p["kernels"])
    assert "ncu case 1:" in captured.err
