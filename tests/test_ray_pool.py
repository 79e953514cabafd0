"""The evaluation pool on a Ray cluster (--cluster ray), on a local Ray instance with CPU actors.

Runs go to their end through the real CLI (offline and replay planners), an actor killed while it
evaluates has its candidate re-run on a fresh actor and recorded once, and an actor whose health
check fails (when it starts, or after a result naming a device fault) is replaced. The tiny package
(tests/tiny_package.py) keeps it fast, with its one-program kernel as the starter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from optagent.app.build import build_evaluator  # noqa: E402
from optagent.cli.main import main  # noqa: E402
from optagent.evaluation.ray_lane import LaneSpec, pack_task, unpack_task  # noqa: E402
from optagent.messages import Phase  # noqa: E402
from optagent.protocols import Pool, PoolJob  # noqa: E402
from optagent.schema import ClusterEngine, Language, RunStatus, Status, StepOutcome  # noqa: E402
from optagent.runs.store import RunStore  # noqa: E402
from optagent.task import TaskError, load_task  # noqa: E402

from tiny_package import FAST, tiny_package  # noqa: E402

FAULT = "CUDA error: an illegal memory access was encountered"
# two edits of the starter's knob, as an LLM would write them
REPLIES = [{"reply": "IDEA: BLOCK 4096 -> 2048: two programs, half the registers each.\n\n<<<<<<< SEARCH\n"
                     "BLOCK = 4096  # knob: 1024, 2048, 4096\n=======\nBLOCK = 2048  # knob: 1024, 2048, 4096\n"
                     ">>>>>>> REPLACE\n"},
           {"reply": "IDEA: BLOCK 4096 -> 1024.\n\n<<<<<<< SEARCH\nBLOCK = 4096  # knob: 1024, 2048, 4096\n=======\n"
                     "BLOCK = 1024  # knob: 1024, 2048, 4096\n>>>>>>> REPLACE\n"}]


@pytest.fixture(scope="module")
def pkg(tmp_path_factory) -> Path:
    root = tiny_package(tmp_path_factory.mktemp("ray") / "tiny")
    (root / "starter" / "naive.py").write_text(FAST)  # one program under the interpreter, not hundreds
    return root


@pytest.fixture(scope="module")
def cluster():
    """One local Ray instance for the module (its start takes seconds); the pool joins it, as a caller's."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=100 << 20,
             logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def only_run(runs: Path) -> RunStore:
    [path] = [p for p in runs.iterdir() if (p / "config.json").is_file()]
    return RunStore(path)


def one_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


# ------------------------------------------------------------------ bad input, no cluster needed

def test_bad_cluster_values_and_a_missing_ray_are_one_line(pkg, tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as e:
        main(["run", str(pkg), "--cluster", "slurm", "--runs-dir", str(runs)])
    assert e.value.code == 2
    assert "--cluster: must be local, ray or ray=ADDRESS, got slurm" in one_line(capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["run", str(pkg), "--cluster", "ray=", "--runs-dir", str(runs)])
    assert "an address after ray=" in one_line(capsys.readouterr().err)

    monkeypatch.setitem(sys.modules, "ray", None)  # as where the extra is not installed
    assert main(["run", str(pkg), "--cluster", "ray", "--planner", "offline", "--quiet", "--runs-dir", str(runs)]) == 2
    assert one_line(capsys.readouterr().err) == ("optagent: error: --cluster ray needs Ray, which is not installed: "
                                                 "pip install 'optagent[cluster]'")
    assert not runs.exists() or not any(runs.iterdir())  # no run was recorded


def test_an_address_nobody_answers_at_is_one_line(pkg, tmp_path):
    env = {**os.environ, "OPTAGENT_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.run([sys.executable, "-m", "optagent.cli.main", "run", str(pkg), "--planner", "offline",
                           "--cluster", "ray=127.0.0.1:9", "--quiet"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 2, proc.stderr
    assert one_line(proc.stderr).startswith("optagent: error: --cluster ray=127.0.0.1:9: nothing answers at")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run was created


def test_the_package_travels_as_an_archive_checked_against_its_digest(pkg, tmp_path, monkeypatch):
    monkeypatch.setenv("OPTAGENT_CACHE", str(tmp_path / "node"))
    task = load_task(pkg)
    spec = LaneSpec(task_name=pkg.name, task_digest=task.digest(), device="cpu", cases=[], timeout_s=1)
    blob = pack_task(pkg)
    root = unpack_task(blob, spec)
    assert root != pkg and load_task(root).digest() == task.digest()
    assert unpack_task(blob, spec) == root  # once a node: the second actor finds it
    other = spec.model_copy(update={"task_digest": "0" * 64})
    with pytest.raises(TaskError, match="digest"):
        unpack_task(blob, other)


# ------------------------------------------------------------------ runs on the cluster

def test_an_offline_run_goes_to_its_end_and_the_orchestrator_never_imports_torch(pkg, tmp_path):
    """Its own local Ray instance (ray.init in the command, no address), started and shut down by it."""
    runs = tmp_path / "runs"
    code = ("import sys; from optagent.cli.main import main; rc = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'the orchestrator imported torch'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, "run", str(pkg), "--planner", "offline", "--cluster", "ray",
                           "--max-steps", "1", "--quiet", "--json", "--runs-dir", str(runs)],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert out["state"]["status"] == RunStatus.MAX_STEPS.value
    store = only_run(runs)
    assert store.config.cluster is ClusterEngine.RAY and store.config.cluster_address is None
    steps = store.steps()
    assert [s.index for s in steps] == [0, 1]
    assert steps[0].outcome is StepOutcome.BASELINE and steps[1].result.status is Status.PASSED
    assert steps[1].result.isolation.mechanism == steps[0].result.isolation.mechanism  # the node's sandbox

    # resume --cluster local hands the run back to this host's pool, recorded in its config
    assert main(["resume", store.path.name, "--cluster", "local", "--quiet", "--runs-dir", str(runs)]) == 0
    assert RunStore(store.path).config.cluster is ClusterEngine.LOCAL


def test_a_replay_run_survives_its_actor_killed_mid_candidate(cluster, pkg, tmp_path):
    """The actor is killed while the candidate's sandbox exists: a fresh actor re-runs it, recorded once."""
    replies = tmp_path / "replies.jsonl"
    replies.write_text("".join(json.dumps(r) + "\n" for r in REPLIES))
    scratch, runs = Path(os.environ["OPTAGENT_SCRATCH"]), tmp_path / "runs"
    killed: list[str] = []
    earlier = set(scratch.glob("*/candidate.py"))  # kept by earlier tests of this process

    def killer() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            if set(scratch.glob("*/candidate.py")) - earlier:  # an evaluation of this run is under way
                for name in ray.util.list_named_actors():
                    if name.startswith("optagent-lane"):
                        ray.kill(ray.get_actor(name))
                        killed.append(name)
            time.sleep(0.2)
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    rc = main(["run", str(pkg), "--planner", "replay", "--replay", str(replies), "--cluster", "ray",
               "--max-steps", "1", "--quiet", "--runs-dir", str(runs)])
    thread.join(5)
    assert rc == 0 and len(killed) == 1
    store = only_run(runs)
    steps = store.steps()
    assert [s.index for s in steps] == [0, 1]  # each step once: the killed evaluation left no record
    assert all(s.result and s.result.status is Status.PASSED for s in steps)
    assert store.state().status is RunStatus.MAX_STEPS
    assert not any(name.startswith(killed[0]) for name in ray.util.list_named_actors())  # the pool closed


def test_step_mode_on_a_ray_run_evaluates_on_the_cluster(cluster, pkg, tmp_path, capsys):
    """An outside agent's proposals for a run recorded with --cluster ray go to the lane actors too."""
    runs = tmp_path / "runs"
    assert main(["run", str(pkg), "--planner", "external", "--cluster", "ray", "--quiet", "--runs-dir", str(runs)]) == 0
    store = only_run(runs)
    kernel = tmp_path / "fast.py"
    kernel.write_text(FAST.replace("BLOCK = 4096", "BLOCK = 2048"))
    capsys.readouterr()
    assert main(["propose", store.path.name, str(kernel), "--idea", "half the block", "--runs-dir", str(runs)]) == 0
    steps = RunStore(store.path).steps()
    assert [s.index for s in steps] == [0, 1] and steps[1].result.status is Status.PASSED
    for s in steps:  # stamped by the Ray pool with the actor that timed it
        assert s.result.timed_on and " on " in s.result.timed_on and "actor pid" in s.result.timed_on, s.result.timed_on


def sick(plan: list[bool], counter: Path):
    """A health check answering from `plan` in order (True: sick), then healthy; by value to the actors."""
    def check(device) -> str | None:
        with open(counter, "a+") as fh:
            fh.seek(0)
            n = len(fh.read())
            fh.write("x")
        return "the sum came out wrong" if n < len(plan) and plan[n] else None
    return check


def test_a_sick_actor_is_replaced_and_a_device_fault_is_checked(cluster, pkg, tmp_path):
    from optagent.app.build import build_lane_pool
    from optagent.evaluation.ray_pool import RayPool

    task = load_task(pkg)
    ev = build_evaluator(task, "cpu", None, hidden=False)
    spec = LaneSpec(task_name=pkg.name, task_digest=task.digest(), device="cpu", cases=ev.cases, timeout_s=120)
    # sick at its start; the second actor healthy, then sick after the fault; the third healthy throughout
    counter = tmp_path / "checks"
    pool = RayPool(spec, pack_task(pkg), build_lane_pool, lanes=1, health=sick([True, False, True], counter))
    try:
        assert isinstance(pool, Pool) and pool.lanes == 1 and pool.replaced == 1
        head = "def run_kernel(x, out, n):\n"
        bad = FAST.replace(head, f"{head}    raise RuntimeError({FAULT!r})\n")
        events = []
        got = list(pool.evaluate([PoolJob(7, bad, Language.TRITON)], progress=events.append))
        assert len(got) == 1  # once, though it ran twice
        assert {e.phase for e in events if e.step == 7} >= {Phase.STARTING, Phase.CASE}  # streamed as they came
        job, result = got[0]
        assert job.key == 7 and result.status is Status.RUNTIME_ERROR and FAULT in result.reason
        assert pool.replaced == 2 and pool.requeued == 1
        assert counter.read_text() == "x" * 5  # two starts, the fault's check, the third start, its check
        assert pool.baseline_runs() == {0: 1}  # the fresh actor timed its own baselines, once
    finally:
        pool.close()


def test_a_retime_is_pinned_to_the_actor_that_timed_the_incumbent():
    """Which actor a re-time goes to (no cluster: the pool's choice alone)."""
    from optagent.evaluation.ray_lane import LaneInfo
    from optagent.evaluation.ray_pool import Flight, RayPool, Slot

    pool = RayPool.__new__(RayPool)
    info = LaneInfo(node="n", pid=1, jobs=2)
    pool.slots = {0: Slot(0, None, None, 0.0, info), 1: Slot(1, None, None, 0.0, info)}
    pool.timed_on = {5: 1, 6: 0}
    asked = []
    pool._run = lambda flights, sink: asked.extend(flights) or iter(flights)
    pool.retime([PoolJob(5, "a", Language.TRITON), PoolJob(6, "b", Language.TRITON)])
    assert asked[0].pinned == 1  # the incumbent's (job 5's) actor, though job 6 was timed on the other
    assert pool._slot_for(asked[0]) is pool.slots[1]
    pool.slots[1] = Slot(1, None, "starting", 0.0)  # replaced since: a fresh actor, no better than another
    assert pool._slot_for(asked[0]) is pool.slots[0] and asked[0].pinned == 0
    evaluation = Flight([PoolJob(7, "c", Language.TRITON)])
    pool.slots[0].busy = 2  # full: an evaluation waits for a free place
    assert pool._slot_for(evaluation) is None
