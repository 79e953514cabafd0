"""The commands that drive a run: run and resume."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from optagent.text import first_line, plain
from optagent.app.build import build_evaluator, build_pool, profile_notice, run_evaluator
from optagent.app.runs import RunRequest, create_run, drive, hand_over, preflight
from optagent.cli.language import pick_language
from optagent.settings import UserError
from optagent.app.build import resolve_device
from optagent.cli.options import (add_eval_options, add_limit_options, add_planner_options, add_pool_options,
                                  add_runs_dir)
from optagent.protocols import Evaluator, Planner, Pool
from optagent.profile_facts import ProfileStatus
from optagent.schema import ClusterEngine, Device, PlannerKind, RunState, RunStatus, Step
from optagent.ranking import timings_rank
from optagent.runs.store import RunStore, runs_dir
from optagent.runs.files import RunError
from optagent.task import TaskPackage, load_task
from optagent.cli.views import console, human_console, print_json
from optagent.report.format import STATUS_STYLE, fmt, isolation_line, ratio


def _progress(con, t0: float, live=None):
    told: list = []  # the profiler's notice that the counters cannot be read, once it came

    def on_step(step: Step, state: RunState) -> None:
        if live is not None:
            live.pause()  # the status line goes; the step's own line takes its place
        r = step.result
        status = r.status.value if r else "NO_KERNEL"
        style = STATUS_STYLE.get(r.status, "") if r else "yellow"
        gm = r.geomean_speedup if r else None
        # the decision is on this time; the speedup also moves with the baseline's own timing
        us = fmt(r.geomean_time_us if r else None, ".1f", " us")
        elapsed = time.monotonic() - t0
        # an interpreter's time ranks nothing: on the CPU the line says what was established instead
        timed = timings_rank(results=[r]) if r else True
        figures = (f"{ratio(gm):>8} {us:>11}  best {ratio(state.best_geomean_speedup):>8}" if timed else
                   f"{'(correct on the cases run)' if r and r.status.ok else '':<35}")
        con.print(f"step {step.index:>3}  [{style}]{status:<13}[/] {step.outcome.value:<10} "
                  f"{figures}  "
                  f"tokens {state.usage.prompt_tokens + state.usage.completion_tokens:>7}  "
                  f"${state.usage.cost_usd:.2f}  {elapsed:6.0f}s  {plain(step.idea[:70], markup=True)}", soft_wrap=True)
        why = step.error or (r.reason if r and not r.status.ok else None)
        if why and why.strip():  # why it failed, so a broken environment does not read as a bad kernel
            con.print(f"          {first_line(why, 150)}", markup=False)
        stuck = next((c.profile for c in (r.cases if r else []) if c.profile
                      and c.profile.status is ProfileStatus.NO_COUNTERS), None)
        if stuck and not told:  # said once: the profiler stops trying for the rest of the run
            told.append(stuck)
            con.print(f"profile: ncu cannot read the GPU's counters here ({plain(stuck.reason, markup=False)}): "
                      "no profiles", markup=False,
                      soft_wrap=True)
    return on_step


def _run_and_report(store: RunStore, task: TaskPackage, a, con, planner: Planner, evaluator: Evaluator, pool: Pool,
                    started: float) -> int:
    """Runs the loop on `pool` (built over `evaluator`) with the step lines and the live status line; started: the
    command's start (time.monotonic()), where its time limit counts from."""
    from optagent.cli.live import LiveProgress

    cfg = store.config
    live = None if a.quiet else LiveProgress(console(stderr=True))

    def announce(memory) -> None:
        con.print(f"run {store.path.name}: {task.name}, {cfg.language.value} on {cfg.device.value}, planner "
                  f"{planner.name}{' (' + planner.model + ')' if planner.model else ''}", soft_wrap=True)
        if cfg.device is Device.CPU:
            con.print("CPU mode: Triton's interpreter on the smoke cases; its times are not GPU times, so a run "
                      "accepts on correctness alone: the best is the first kernel that passed, never replaced on "
                      "a timing", soft_wrap=True)
        con.print(isolation_line(evaluator.planned_isolation), soft_wrap=True)
        if cfg.profile:
            con.print(profile_notice(evaluator), markup=False, soft_wrap=True)
        con.print(memory.summary(), markup=False, soft_wrap=True)

    try:
        state = drive(store, task, planner, pool, on_step=_progress(con, time.monotonic(), live), progress=live,
                      on_start=announce, started=started).state
    finally:
        if live is not None:
            live.close()
    best = store.best()
    outcome = f"{state.status.value}: {state.reason or 'stopped'}. {state.steps} step{'s' * (state.steps != 1)}"
    if best and timings_rank(cfg.device, [best[1]]):
        outcome += f"; best geomean speedup {ratio(state.best_geomean_speedup)} (step {state.best_step})"
    elif best:  # a CPU run: which kernels work, and how to rank them
        passed = [str(s.index) for s in store.steps() if s.result is not None and s.result.status.ok]
        outcome += (f"; kernels that passed: step {', '.join(passed)}. A CPU run checks correctness only: rank them "
                    f"with `optagent retime {cfg.run_id}` on a GPU")
    con.print(plain(outcome, markup=False), markup=False, soft_wrap=True)
    if best:
        con.print(f"best kernel: {store.path / 'best'}")
    if a.json:
        print_json({"run_id": store.config.run_id, "path": str(store.path), "state": state.model_dump(mode="json"),
                    "best": best[1].model_dump(mode="json") if best else None})
    return {RunStatus.INTERRUPTED: 130, RunStatus.FAILED: 1}.get(state.status, 0)


def cmd_run(a) -> int:
    from optagent.llm.config import llm_settings_from_env

    started = time.monotonic()  # --time-limit counts from here: the language's choice is the run's time too
    task = load_task(a.dir)
    device = resolve_device(a.device)
    con = human_console(a)
    language, why, starters = pick_language(
        task, device, a.language, lambda: build_evaluator(task, device, a.cases, hidden=not a.no_hidden,
                                                          timeout_s=a.timeout, compiler=a.compiler,
                                                          profile=a.profile),
        lambda line: con.print(line, markup=False, soft_wrap=True), started + a.time_limit if a.time_limit else None)
    con.print(f"language {language.value}: {why}", markup=False, soft_wrap=True)
    planner = PlannerKind(a.planner)
    if planner is PlannerKind.AUTO:
        planner = PlannerKind.LLM if llm_settings_from_env(a.base_url, a.model) else PlannerKind.OFFLINE
        if planner is PlannerKind.OFFLINE:
            con.print("no LLM endpoint configured (--base-url/--model or OPTAGENT_BASE_URL/OPTAGENT_MODEL): "
                      "using the built-in offline planner", soft_wrap=True)
    if planner is PlannerKind.REPLAY and not a.replay:
        raise UserError("--planner replay needs --replay FILE")
    llm = llm_settings_from_env(a.base_url, a.model) if planner is PlannerKind.LLM else None
    engine, address = a.cluster or (ClusterEngine.LOCAL, None)
    config = RunRequest(
        device=device, planner=planner, language=language, language_reason=why,
        model=llm.model if llm else None, base_url=llm.base_url if llm else None,
        replay_file=str(Path(a.replay).resolve()) if a.replay else None, compiler=a.compiler,
        request_timeout_s=a.request_timeout, max_tokens=int(a.max_tokens) if a.max_tokens else None,
        temperature=a.temperature, cases=a.cases, hidden=not a.no_hidden, fresh=a.fresh, profile=a.profile,
        timeout_s=a.timeout, min_gain=a.min_gain, patience=a.patience, max_steps=a.max_steps, width=a.width,
        time_limit_s=a.time_limit, budget_usd=a.budget_usd, cluster=engine, cluster_address=address).config(task)
    evaluator = run_evaluator(config, task)  # a bad --cases fails before a run exists
    root = runs_dir(a.runs_dir)
    planner = preflight(task, config)
    known = {(task.starter(language).source, language): starters[language]} if language in starters else {}
    pool = build_pool(evaluator, a.jobs, known, config)  # a cluster that cannot evaluate fails here, before the run
    try:
        store = create_run(root, task, config)
    except BaseException:
        pool.close()
        raise
    return _run_and_report(store, task, a, con, planner, evaluator, pool, started)


def cmd_resume(a) -> int:
    started = time.monotonic()
    store = RunStore.open(runs_dir(a.runs_dir), a.run_id)
    cfg = store.config
    if a.task is None and not Path(cfg.task_dir).is_dir():
        raise RunError(f"run {cfg.run_id}: its task package {cfg.task_dir} is not on this machine "
                       "(pass --task DIR where it is)")
    task = load_task(a.task or cfg.task_dir)
    if task.digest() != cfg.task_digest and not a.force:
        raise RunError(f"{task.root}: the task package changed since run {cfg.run_id} started "
                       "(resume with --force to continue anyway)")
    cfg = hand_over(store, task, planner=PlannerKind(a.planner) if a.planner else None, replay=a.replay,
                    base_url=a.base_url, model=a.model, cluster=a.cluster)
    planner, evaluator = preflight(task, cfg), run_evaluator(cfg, task)
    return _run_and_report(store, task, a, human_console(a), planner, evaluator, build_pool(evaluator, a.jobs, None, cfg),
                           started)


def add_run_commands(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="optimise a task package's kernel: propose, evaluate, keep the best, repeat")
    r.add_argument("dir", help="task package directory")
    add_eval_options(r)
    add_planner_options(r)
    add_limit_options(r)
    add_pool_options(r)
    r.add_argument("--fresh", action="store_true", help="recall nothing from earlier runs on the task (its "
                   "ledger): no settings skipped, no start from the best known kernel; the run is still recorded")
    r.add_argument("--quiet", action="store_true")
    r.add_argument("--json", action="store_true", help="print the run id, final state and best result as JSON "
                   "on stdout (everything else goes to stderr)")
    add_runs_dir(r)
    r.set_defaults(fn=cmd_run)

    s = sub.add_parser("resume", help="continue a stopped or killed run where it stopped")
    s.add_argument("run_id", help="run id, a unique prefix of it, or a run directory's path")
    s.add_argument("--force", action="store_true", help="resume even if the task package changed")
    s.add_argument("--planner", choices=[k.value for k in PlannerKind if k is not PlannerKind.AUTO],
                   help="hand the run to another planner (e.g. from an outside agent to offline, and back)")
    s.add_argument("--replay", metavar="FILE", help="recorded replies, with --planner replay")
    s.add_argument("--base-url", help="with --planner llm (or OPTAGENT_BASE_URL)")
    s.add_argument("--model", help="with --planner llm (or OPTAGENT_MODEL)")
    s.add_argument("--task", help="the task package's directory, where the run was moved from another machine "
                   "(its digest must match the run's)")
    s.add_argument("--quiet", action="store_true")
    add_pool_options(s, resume=True)
    s.add_argument("--json", action="store_true", help="as for run")
    add_runs_dir(s)
    s.set_defaults(fn=cmd_resume)
