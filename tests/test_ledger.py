"""The ledger file and the memory built on it, without evaluations: concurrent writers, a torn line,
a re-committed step, backfill from run folders made before the ledger, the loop's one call, and the
bound on what the LLM planner is told."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from optagent.evaluation.serial_pool import SerialPool

from optagent.protocols import Memory
from optagent.runs.view import PlannerContext
from optagent.schema import Device, Language, PlannerKind, RunConfig, Status, StepOutcome, now
from optagent.runs.ledger import Ledger, LedgerEntry, ledger_path
from optagent.search.loop import Limits, Loop
from optagent.runs.memory import Recall, RunMemory
from optagent.search.planners.llm import build_messages
from optagent.search.planners.memory_view import MAX_ROWS
from optagent.runs.store import RunStore
from optagent.task import load_task

from test_loop import ScriptedEvaluator, ScriptedPlanner

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "fixtures" / "run_sample" / "20260721-093012-flashattn_decode-3f9a2c"
T0 = now()


def entry(run: str, step: int, outcome: StepOutcome = StepOutcome.NOT_BETTER, status: Status | None = Status.PASSED,
          idea: str | None = None, speedup: float | None = 1.0, reason: str | None = None,
          device_name: str = "cpu", seconds: int = 0) -> LedgerEntry:
    return LedgerEntry(run_id=run, step=step, idea=idea or f"idea {run} {step}", planner=PlannerKind.OFFLINE,
                       outcome=outcome, status=status, reason=reason, speedup=speedup,
                       geomean_time_us=100.0 / speedup if speedup else None, device=Device.CPU,
                       device_name=device_name, language=Language.TRITON, kernel_sha256=f"{run}-{step}",
                       source=f"{run}/steps/{step:04d}/candidate.py", finished_at=T0 + timedelta(seconds=seconds))


def _writer(path: str, run: str, count: int) -> None:
    ledger = Ledger(Path(path))
    for i in range(count):
        ledger.append(entry(run, i))
        ledger.append(entry("shared", 0))  # both writers record the same step: it is written once


def test_two_writers_at_once_leave_one_entry_per_run_and_step(tmp_path):
    path = tmp_path / "ledger" / "t-0.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), run, 150)) for run in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = path.read_bytes().splitlines()
    assert len(lines) == 301 and all(json.loads(line) for line in lines)  # never interleaved
    ledger = Ledger(path)
    keys = [e.key for e in ledger.entries()]
    assert len(keys) == len(set(keys)) == 301 and ledger.skipped == 0
    assert {k for k in keys if k[0] == "a"} == {("a", i) for i in range(150)}


def test_a_torn_last_line_is_skipped_and_ended_by_the_next_writer(tmp_path):
    path = tmp_path / "t-0.jsonl"
    Ledger(path).append(entry("a", 0))
    with open(path, "ab") as fh:
        fh.write(b'{"format_version":1,"run_id":"a","step":1,"id')  # a writer killed mid-line
    reader = Ledger(path)
    assert [e.key for e in reader.entries()] == [("a", 0)]  # readable, not fatal
    assert Ledger(path).append(entry("a", 2))
    reader2 = Ledger(path)
    assert [e.key for e in reader2.entries()] == [("a", 0), ("a", 2)] and reader2.skipped == 1
    assert [e.key for e in reader.entries()] == [("a", 0), ("a", 2)]  # a reader that read the torn part goes on
    assert json.loads(path.read_bytes().splitlines()[-1])["step"] == 2


def test_a_recommitted_step_stays_one_entry(tmp_path):
    path = tmp_path / "t-0.jsonl"
    e = entry("a", 3)
    assert Ledger(path).append(e)
    assert not Ledger(path).append(e)  # a resumed run recording its commit again (another process: from disk)
    assert len(path.read_bytes().splitlines()) == 1
    again = e.model_copy(update={"finished_at": e.finished_at + timedelta(seconds=5), "outcome": StepOutcome.FAILED,
                                 "status": Status.TIMEOUT, "reason": "timed out"})
    assert Ledger(path).append(again)  # the step evaluated anew: the later commit replaces it
    assert Ledger(path).append(entry("a", 4))
    (got, _) = Ledger(path).entries()
    assert got.key == ("a", 3) and got.status is Status.TIMEOUT


def sample_runs(tmp_path: Path) -> tuple[Path, RunStore]:
    """The recorded sample run (made before the ledger existed) and a new run on the same task beside it."""
    runs = tmp_path / "runs"
    shutil.copytree(SAMPLE, runs / SAMPLE.name)
    cfg = RunStore(runs / SAMPLE.name).config.model_copy(update={"run_id": "new-run", "created_at": now()})
    return runs, RunStore.create(runs, cfg, "starter")


def test_backfill_reads_runs_made_before_the_ledger_once(tmp_path):
    runs, store = sample_runs(tmp_path)
    memory = RunMemory(store)
    assert isinstance(memory, Memory) and memory.backfilled == 12
    path = ledger_path(runs, "flashattn_decode", store.config.task_digest)
    assert memory.ledger.path == path and path.name.startswith("flashattn_decode-sha256_974cc")
    entries = Ledger(path).entries()
    old = RunStore(runs / SAMPLE.name)
    assert [(e.step, e.outcome, e.status) for e in entries] == [
        (s.index, s.outcome, s.result.status if s.result else None) for s in old.steps()]
    by = {e.step: e for e in entries}
    assert by[3].reason.startswith(old.steps()[3].error.splitlines()[0][:50]) and by[5].kernel_sha256 is None
    assert (runs / by[9].source).read_text() == old.step_source(9) and by[9].device_name == "NVIDIA H200"
    assert RunMemory(store).backfilled == 0  # once
    recall = memory.recall()
    assert recall.runs == 1 and len(recall.entries) == 12
    assert recall.best is None  # this run has measured nothing yet: its device is not known to be an H200
    (best,) = recall.best_per_bench.values()
    assert best.step == 9 and best.outcome is StepOutcome.ACCEPTED
    assert RunMemory(store, fresh=True).recall() is None


def test_the_loop_records_each_step_and_planners_recall_earlier_runs(tmp_path, task_dir):
    task = load_task(task_dir)
    runs = tmp_path / "runs"
    seen = []

    def one_run(run_id: str, sources: list[str]) -> RunStore:
        cfg = RunConfig(run_id=run_id, task_dir=str(task.root), task_name=task.name, task_digest="d",
                        language=Language.TRITON, device="cpu", planner="offline", timeout_s=10, min_gain=0.01,
                        patience=5, max_steps=50)
        store = RunStore.create(runs, cfg, "starter")
        planner = ScriptedPlanner(sources)
        evaluator = ScriptedEvaluator({"starter": [100.0], "fast": [50.0], "broken": [Status.COMPILE_ERROR]})
        Loop(store, task, planner, SerialPool(evaluator), Limits(), memory=RunMemory(store)).run()
        seen.append(planner.contexts)
        return store

    one_run("run-1", ["fast", "broken"])
    one_run("run-2", ["fast"])
    entries = Ledger(ledger_path(runs, task.name, "d")).entries()
    assert [(e.run_id, e.step, e.outcome) for e in entries] == [
        ("run-1", 0, StepOutcome.BASELINE), ("run-1", 1, StepOutcome.ACCEPTED), ("run-1", 2, StepOutcome.FAILED),
        ("run-2", 0, StepOutcome.BASELINE), ("run-2", 1, StepOutcome.ACCEPTED)]
    assert entries[2].status is Status.COMPILE_ERROR and entries[2].reason == "scripted failure"
    assert all(c.memory is None for c in seen[0])  # nothing earlier
    memory = seen[1][0].memory
    assert [e.key for e in memory.entries] == [("run-1", 0), ("run-1", 1), ("run-1", 2)]
    assert memory.best.entry.key == ("run-1", 1) and memory.best.source == "fast"


def big_recall(n: int) -> Recall:
    kinds = [Status.COMPILE_ERROR, Status.INCORRECT, Status.TIMEOUT, Status.RUNTIME_ERROR]
    entries = []
    for i in range(n):
        if i % 3 == 0:
            entries.append(entry(f"r{i // 50}", i, StepOutcome.FAILED, kinds[i % 4], idea=f"idea {i} " + "x" * 300,
                                 speedup=None, reason="a long reason " * 50))
        else:
            entries.append(entry(f"r{i // 50}", i, idea=f"idea {i}", speedup=1.0 + i / 1000))
    entries[5] = entry("r0", 5, StepOutcome.ACCEPTED, idea="the winner", speedup=9.0)
    bench = entries[5].bench
    return Recall(entries, bench, None, {bench: entries[5]})


def memory_block(recall: Recall) -> str:
    ctx = PlannerContext("t", "T", "s", "c", Language.TRITON, "starter", "starter", None, memory=recall)
    user = build_messages(ctx)[1]["content"]
    start = user.index("## What earlier runs on this task found")
    return user[start:user.index("\n## ", start + 1)]


def test_the_llm_prompt_stays_bounded_as_the_ledger_grows():
    small, big = memory_block(big_recall(30)), memory_block(big_recall(500))
    assert "500 attempts from 10 earlier run(s)" in big
    rows = [line for line in big.splitlines() if line.startswith("| r") and not line.startswith("| run |")]
    assert len(rows) == MAX_ROWS and len(big) < 6000 and len(big) < len(small) + 500
    assert "| r0 | 5 | cpu, triton | the winner | ACCEPTED | 9.000x" in big  # the best first
    assert "- cpu, triton: 9.000x, run r0 step 5: the winner" in big
    for kind in ("COMPILE_ERROR", "INCORRECT", "TIMEOUT", "RUNTIME_ERROR"):  # one failure of each kind
        assert f"| FAILED | {kind}: a long reason" in big
    assert "x" * 300 not in big
    bare = PlannerContext("t", "T", "s", "c", Language.TRITON, "starter", "starter", None)
    assert "earlier runs" not in build_messages(bare)[1]["content"]


def test_a_hidden_case_failure_is_kept_as_planners_may_see_it():
    from optagent.schema import CaseKind, CaseResult, EvalResult, Step
    from optagent.runs.ledger import Bench, make_entry

    secret = "hidden-1 (n=1000): element 17 differs"
    hidden = CaseResult(case="hidden-1", kind=CaseKind.HIDDEN, status=Status.INCORRECT, reason=secret)
    result = EvalResult(status=Status.INCORRECT, reason=f"case {secret}", language=Language.TRITON, device="cpu",
                        source_sha256="s", cases=[hidden], wall_s=0.0)
    step = Step(index=2, started_at=T0, finished_at=T0, idea="i", outcome=StepOutcome.FAILED, candidate_sha256="s",
                result=result, error=result.reason)
    e = make_entry("r", step, planner=PlannerKind.LLM, bench=Bench(Device.CPU, "cpu", Language.TRITON, None),
                   source="r/steps/0002/candidate.py", meta={"reply_kind": "edit"}, incumbent_us=None)
    assert e.reason == "a hidden integrity case failed: INCORRECT" and "element 17" not in e.model_dump_json()
    assert e.setting is None and e.status is Status.INCORRECT and e.gain is None
    # nor through the step's error (the result's reason again) in what a planner is shown of the step
    from optagent.runs.view import as_attempt
    from optagent.search.planners.llm import build_messages

    seen = as_attempt(step)
    assert seen.error == "a hidden integrity case failed: INCORRECT" and "element 17" not in (seen.result.reason or "")
    ctx = PlannerContext("t", "T", "s", "c", Language.TRITON, "starter", "starter", None, attempts=[seen])
    assert "element 17" not in build_messages(ctx)[1]["content"]


def test_a_cpu_run_recalls_gpu_findings_but_neither_starts_from_nor_skips_them(tmp_path):
    from test_loop import result

    runs, _ = sample_runs(tmp_path)
    old = RunStore(runs / SAMPLE.name)
    cfg = old.config.model_copy(update={"run_id": "cpu-run", "device": Device.CPU, "created_at": now()})
    store = RunStore.create(runs, cfg, "starter")
    memory = RunMemory(store)
    store.save_candidate(0, "starter", Language.TRITON)
    ran = result("starter", 100.0).model_copy(update={"device_name": "cpu"})
    step = old.steps()[0].model_copy(update={"result": ran, "candidate_sha256": ran.source_sha256})
    memory.record(step)
    recall = memory.recall()
    assert recall.bench.device is Device.CPU and recall.bench.device_name == "cpu"
    assert len(recall.entries) == 12 and recall.best is None and recall.measured == {}  # the H200's stay apart
    assert [b.device_name for b in recall.best_per_bench] == ["NVIDIA H200"]  # still told to an LLM
    gpu = RunMemory(RunStore.create(runs, old.config.model_copy(update={"run_id": "gpu-run"}), "starter"))
    gpu.record(old.steps()[0])  # measured on the H200: the sample's best is this run's known best
    known = gpu.recall().best
    assert known.entry.key == (SAMPLE.name, 9) and known.source == old.step_source(9)
    assert SAMPLE.name in {e.run_id for e in gpu.recall().measured.values()}
