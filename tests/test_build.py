"""One builder (cli/build.py), the Device and PlannerKind enums, and defaults written once.

The enums are str enums: run files written when device and planner were plain strings
still read, and what is written now is the same JSON.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from jinja2 import Environment

from optagent.app.build import build_evaluator, build_planner, run_evaluator, run_limits
from optagent.settings import UserError
from optagent.cli.main import build_parser, main
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.messages import Job
from optagent.schema import CaseKind, Device, EvalResult, Language, PlannerKind, RunConfig, Status
from optagent.search.loop import Limits
from optagent.runs.store import RunStore, list_runs
from optagent.runs.files import read_record
from optagent.task import load_task

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "run_sample"
GPU_RUN = "20260721-093012-flashattn_decode-3f9a2c"


def config(task, **over) -> RunConfig:
    fields = dict(run_id="r1", task_dir=str(task.root), task_name=task.name, task_digest=task.digest(),
                  language=Language.TRITON, device="cpu", planner="offline", timeout_s=60, min_gain=0.02,
                  patience=3, max_steps=4)
    return RunConfig(**{**fields, **over})


# --- the enums keep the files as they were ---

def test_an_old_config_with_plain_strings_still_loads_and_writes_the_same_json(tmp_path):
    old = json.loads((FIXTURES / GPU_RUN / "config.json").read_text())
    old.update(device="cpu", planner="replay", replay_file="/r.jsonl")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old, indent=2))
    cfg = read_record(path, RunConfig)
    assert cfg.device is Device.CPU and cfg.planner is PlannerKind.REPLAY
    written = json.loads(cfg.model_dump_json())
    assert {k: written[k] for k in old} == old  # (the fixture predates `hidden`, which is written too)


def test_the_recorded_gpu_run_reads_with_enum_members():
    store = next(s for s in list_runs(FIXTURES) if s.path.name == GPU_RUN)
    assert store.config.device is Device.CUDA and store.config.planner is PlannerKind.LLM
    best = store.best()
    assert best is not None and best[1].device is Device.CUDA


def test_a_bad_device_in_a_record_is_refused():
    with pytest.raises(ValueError, match="device"):
        EvalResult(status=Status.PASSED, language=Language.TRITON, device="tpu", source_sha256="0", wall_s=0)


def test_device_and_planner_print_as_their_values():
    # f-strings, str(), width specs and templates all saw plain strings before
    assert f"{Device.CPU}|{PlannerKind.LLM:>5}|{str(Device.CUDA)}" == "cpu|  llm|cuda"
    assert Environment(autoescape=True).from_string("{{ d }} {{ p }}").render(d=Device.CPU, p=PlannerKind.OFFLINE) \
        == "cpu offline"
    job = Job(mode="probe", task_dir="/t", device="cuda", nonce="n", scratch="/s")
    assert job.device is Device.CUDA and json.loads(job.model_dump_json())["device"] == "cuda"


def test_language_knows_its_extension_and_fence(tmp_path, task_dir):
    assert [(x.ext, x.fence) for x in Language] == [(".py", "python"), (".cu", "cuda"), (".py", "python")]
    store = RunStore.create(tmp_path, config(load_task(task_dir), language=Language.CUDA), "__global__ void k() {}")
    assert (store.path / "starter.cu").read_text() == "__global__ void k() {}"
    assert store.starter == "__global__ void k() {}"


# --- defaults written once ---

def test_run_defaults_are_the_loops_and_the_evaluators(tmp_path):
    a = build_parser().parse_args(["run", str(tmp_path)])
    limits = Limits()
    assert (a.min_gain, a.patience, a.max_steps, a.time_limit, a.budget_usd) == \
        (limits.min_gain, limits.patience, limits.max_steps, limits.time_limit_s, limits.budget_usd)
    assert a.timeout == inspect.signature(SandboxEvaluator).parameters["timeout_s"].default
    assert a.planner == PlannerKind.AUTO
    for kind in PlannerKind:  # every kind is a --planner choice, and so is every device a --device one
        assert build_parser().parse_args(["run", str(tmp_path), "--planner", kind.value]).planner == kind
    for device in Device:
        assert build_parser().parse_args(["eval", str(tmp_path), "k.py", "--device", device.value]).device == device


def test_run_limits_carry_the_recorded_config(task_dir):
    cfg = config(load_task(task_dir), time_limit_s=30.0, budget_usd=1.5)
    assert run_limits(cfg) == Limits(min_gain=0.02, patience=3, max_steps=4, time_limit_s=30.0, budget_usd=1.5)


def test_the_width_is_recorded_and_carried_to_the_loop_and_the_pool_is_a_pool(task_dir):
    from optagent.app.build import build_pool
    from optagent.protocols import Pool

    cfg = config(load_task(task_dir), width=3)
    assert run_limits(cfg).width == 3 and RunConfig.model_validate_json(cfg.model_dump_json()).width == 3
    assert config(load_task(task_dir)).width == 1  # old configs: one candidate a round
    from optagent.app.build import build_evaluator

    pool = build_pool(build_evaluator(load_task(task_dir), Device.CPU, None))
    assert isinstance(pool, Pool) and pool.lanes == 1  # one timing lane on a CPU


# --- the builder ---

def test_build_evaluator_picks_the_cases_and_splits_the_compiler(task_dir):
    task = load_task(task_dir)
    ev = build_evaluator(task, Device.CPU, None, timeout_s=12.0, compiler="nvcc -O3 '{src}'")
    assert isinstance(ev, SandboxEvaluator)
    assert ev.device is Device.CPU and ev.timeout_s == 12.0 and ev.compiler == ["nvcc", "-O3", "{src}"]
    kinds = {c.kind for c in ev.cases}
    assert kinds == {CaseKind.SMOKE, CaseKind.HIDDEN}  # on the CPU: the smoke cases, and the hidden ones
    shown = build_evaluator(task, Device.CPU, None, hidden=False)
    assert {c.kind for c in shown.cases} == {CaseKind.SMOKE} and shown.compiler is None
    again = run_evaluator(config(task, hidden=False, timeout_s=7.0), task)
    assert [c.label for c in again.cases] == [c.label for c in shown.cases] and again.timeout_s == 7.0


def test_build_planner_for_each_kind(tmp_path, task_dir, monkeypatch):
    task = load_task(task_dir)
    offline = build_planner(config(task), task)
    assert offline.name == PlannerKind.OFFLINE and f"{offline.name}" == "offline"
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["IDEA: none\n```python\ndef run_kernel(): pass\n```"]))
    assert build_planner(config(task, planner="replay", replay_file=str(replies)), task).name == "replay"
    with pytest.raises(UserError, match=r"missing\.json"):
        build_planner(config(task, planner="replay", replay_file=str(tmp_path / "missing.json")), task)
    for var in ("OPTAGENT_BASE_URL", "OPTAGENT_MODEL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UserError, match="needs --base-url and --model"):
        build_planner(config(task, planner="llm"), task)
    with pytest.raises(UserError, match="no planner 'auto'"):
        build_planner(config(task, planner="auto"), task)


def test_eval_and_run_refuse_a_bad_case_list_through_the_builder(tmp_path, task_dir, capsys):
    kernel = tmp_path / "k.py"
    kernel.write_text(load_task(task_dir).starter(Language.TRITON).source)
    assert main(["eval", str(task_dir), str(kernel), "--device", "cpu", "--cases", "0"]) == 2
    assert main(["run", str(task_dir), "--device", "cpu", "--cases", "0", "--planner", "offline",
                 "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.count("optagent: error: --cases") == 2, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run was recorded
