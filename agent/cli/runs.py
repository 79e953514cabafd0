"""Run commands: run, resume, runs, show, leaderboard."""

from __future__ import annotations

import argparse
import os
import shlex
import time
from pathlib import Path
from typing import Optional

from rich.table import Table

from optagent.cli.inputs import NON_NEGATIVE, PATIENCE, SECONDS, STEPS, UserError, check_env
from optagent.schema import Language, RunConfig, RunState, RunStatus, Step
from optagent.search.store import RunError, RunStore, list_runs, runs_dir
from optagent.task import TaskPackage, load_task
from optagent.cli.views import (STATUS_STYLE, console, fmt, human_console, isolation_line, keep_ids_whole, print_eval,
                                print_json, ratio)


def _pick_language(task: TaskPackage, device: str, wanted: Optional[str]) -> Language:
    import importlib.util

    if wanted:
        lang = Language(wanted)
        task.starter(lang)  # raises a one-line TaskError when there is none
        return lang

    def runs_here(lang: Language) -> bool:
        if lang is Language.CUDA:
            return device == "cuda"
        if lang is Language.TILELANG:
            return device == "cuda" and importlib.util.find_spec("tilelang") is not None
        return True

    for lang in task.languages:
        if runs_here(lang):
            return lang
    raise UserError(f"{task.root}: no starter language runs on {device} (have: "
                    f"{', '.join(x.value for x in task.languages)})")


def _planner(config: RunConfig, task: TaskPackage):
    from optagent.search.planners.offline import OfflinePlanner, run_kernel_params

    if config.planner == "replay":
        from optagent.search.planners.replay import ReplayPlanner

        try:
            return ReplayPlanner(config.replay_file)
        except ValueError as e:  # names the file
            raise UserError(str(e)) from None
    if config.planner == "llm":
        from optagent.llm.client import LLMUnreachable, OpenAICompatLLM
        from optagent.llm.config import llm_settings_from_env
        from optagent.search.planners.llm import LLMPlanner

        settings = llm_settings_from_env(config.base_url, config.model)
        if settings is None:
            raise UserError("the LLM planner needs --base-url and --model (or OPTAGENT_BASE_URL/OPTAGENT_MODEL)")
        llm = OpenAICompatLLM(settings.base_url, settings.model, settings.api_key, prices=settings.prices)
        try:  # once, before step 0: an endpoint that cannot answer would cost every step its retries
            llm.check()
        except LLMUnreachable as e:
            raise UserError(str(e)) from None
        return LLMPlanner(llm)
    starter = task.starter(config.language).source
    return OfflinePlanner(config.language, task.manifest.family if task.manifest else None,
                          run_kernel_params(starter))


def _progress(con, t0: float, live=None):
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
        con.print(f"step {step.index:>3}  [{style}]{status:<13}[/] {step.outcome.value:<10} "
                  f"{ratio(gm):>8} {us:>11}  best {ratio(state.best_geomean_speedup):>8}  "
                  f"tokens {state.usage.prompt_tokens + state.usage.completion_tokens:>7}  "
                  f"${state.usage.cost_usd:.2f}  {elapsed:6.0f}s  {step.idea[:70]}", soft_wrap=True)
        why = step.error or (r.reason if r and not r.status.ok else None)
        if why and why.strip():  # why it failed, so a broken environment does not read as a bad kernel
            con.print(f"          {why.strip().splitlines()[0][:150]}", markup=False)
    return on_step


def _preflight(task: TaskPackage, config: RunConfig):
    """Everything step 0 would otherwise find out the slow way; returns the run's planner."""
    from optagent.evaluation.evaluator import probe_task

    check_env()
    planner = _planner(config, task)  # an LLM endpoint is checked here: milliseconds, the probe takes seconds
    probe_task(task, cached=True)  # a package that does not load is a TaskError; only a good probe is cached
    return planner


def _drive(store: RunStore, task: TaskPackage, a, con, planner) -> int:
    from optagent.evaluation.evaluator import SandboxEvaluator, choose_cases
    from optagent.cli.live import LiveProgress
    from optagent.search.loop import Limits, Loop

    cfg = store.config
    cases = choose_cases(task, cfg.device, cfg.cases, hidden=cfg.hidden)
    evaluator = SandboxEvaluator(task, cfg.device, cases, timeout_s=cfg.timeout_s,
                                 compiler=shlex.split(cfg.compiler) if cfg.compiler else None)
    limits = Limits(cfg.min_gain, cfg.patience, cfg.max_steps, cfg.time_limit_s, cfg.budget_usd)
    store.lock()
    live = None if a.quiet else LiveProgress(console(stderr=True))
    try:
        con.print(f"run {store.path.name}: {task.name}, {cfg.language.value} on {cfg.device}, planner "
                  f"{planner.name}{' (' + planner.model + ')' if planner.model else ''}", soft_wrap=True)
        if cfg.device == "cpu":
            con.print("CPU mode: Triton's interpreter on the smoke cases; times and speedups show that kernels "
                      "work and compare them with each other, not how fast they are on a GPU", soft_wrap=True)
        con.print(isolation_line(evaluator.planned_isolation), soft_wrap=True)
        state = Loop(store, task, planner, evaluator, limits, _progress(con, time.monotonic(), live),
                     progress=live).run()
    finally:
        if live is not None:
            live.close()
        store.unlock()
    best = store.best()
    outcome = f"{state.status.value}: {state.reason or 'stopped'}. {state.steps} step{'s' * (state.steps != 1)}"
    if best:
        outcome += f"; best geomean speedup {ratio(state.best_geomean_speedup)} (step {state.best_step})"
    con.print(outcome, markup=False, soft_wrap=True)
    if best:
        con.print(f"best kernel: {store.path / 'best'}")
    if a.json:
        print_json({"run_id": store.config.run_id, "path": str(store.path), "state": state.model_dump(mode="json"),
                    "best": best[1].model_dump(mode="json") if best else None})
    return {RunStatus.INTERRUPTED: 130, RunStatus.FAILED: 1}.get(state.status, 0)


def cmd_run(a) -> int:
    from optagent.cli.main import _device
    from optagent.llm.config import llm_settings_from_env

    task = load_task(a.dir)
    device = _device(a.device)
    language = _pick_language(task, device, a.language)
    con = human_console(a)
    planner = a.planner
    if planner == "auto":
        planner = "llm" if llm_settings_from_env(a.base_url, a.model) else "offline"
        if planner == "offline":
            con.print("no LLM endpoint configured (--base-url/--model or OPTAGENT_BASE_URL/OPTAGENT_MODEL): "
                      "using the built-in offline planner", soft_wrap=True)
    if planner == "replay" and not a.replay:
        raise UserError("--planner replay needs --replay FILE")
    settings = llm_settings_from_env(a.base_url, a.model) if planner == "llm" else None
    from optagent.evaluation.evaluator import choose_cases

    choose_cases(task, device, a.cases, hidden=not a.no_hidden)  # a bad --cases fails before a run exists
    from optagent.search.store import new_run_id

    config = RunConfig(run_id=new_run_id(task.name), task_dir=str(task.root), task_name=task.name,
                       task_digest=task.digest(), language=language, device=device, planner=planner,
                       model=settings.model if settings else None, base_url=settings.base_url if settings else None,
                       replay_file=str(Path(a.replay).resolve()) if a.replay else None, compiler=a.compiler,
                       cases=a.cases, hidden=not a.no_hidden, timeout_s=a.timeout, min_gain=a.min_gain, patience=a.patience,
                       max_steps=a.max_steps, time_limit_s=a.time_limit, budget_usd=a.budget_usd)
    root = runs_dir(a.runs_dir)
    planner = _preflight(task, config)
    store = RunStore.create(root, config, task.starter(language).source)
    return _drive(store, task, a, con, planner)


def cmd_resume(a) -> int:
    store = RunStore.open(runs_dir(a.runs_dir), a.run_id)
    cfg = store.config
    task = load_task(cfg.task_dir)
    if task.digest() != cfg.task_digest and not a.force:
        raise RunError(f"{task.root}: the task package changed since run {cfg.run_id} started "
                       "(resume with --force to continue anyway)")
    return _drive(store, task, a, human_console(a), _preflight(task, cfg))


def cmd_runs(a) -> int:
    from optagent.cli.run_summary import print_runs, summarize

    root = runs_dir(a.runs_dir)
    runs = [summarize(store) for store in list_runs(root)]
    if a.json:
        print_json([r.model_dump(mode="json") for r in runs])
        return 0
    # with --runs-dir, the hint to resume names the run's path, which works from anywhere
    print_runs(console(), runs, f"runs in {root}", by_path=bool(a.runs_dir))
    return 0


def cmd_show(a) -> int:
    from optagent.cli.run_summary import live_status, status_text

    store = RunStore.open(runs_dir(a.runs_dir), a.run_id)
    con = console()
    cfg, st, steps = store.config, store.state(), store.steps()  # all read before anything is printed
    status, driven = live_status(store, st)
    if a.json:
        steps = [s for s in steps if a.step is None or s.index == a.step]
        print_json({"config": cfg.model_dump(mode="json"), "state": st.model_dump(mode="json") if st else None,
                    "status": status.value if status else None, "driven": driven,
                    "steps": [s.model_dump(mode="json") for s in steps]})
        return 0
    if a.step is not None:
        step = next((s for s in steps if s.index == a.step), None)
        if step is None:
            raise RunError(f"{store.path}: no finished step {a.step}")
        con.print(f"step {step.index}: {step.outcome.value} - {step.idea}", markup=False)
        if step.retime_note:
            con.print(step.retime_note, markup=False)
        if step.result:
            print_eval(con, step.result)
        elif step.error:
            con.print(step.error, markup=False)
        return 0
    best = store.best()
    shown = status_text(store, status, driven, a.run_id if os.sep in a.run_id else cfg.run_id)
    con.print(f"run {cfg.run_id}: task {cfg.task_name} ({cfg.task_dir}), {cfg.language.value} on {cfg.device}, "
              f"planner {cfg.planner}{'/' + cfg.model if cfg.model else ''}; status {shown}"
              + (f" ({st.reason})" if st and st.reason else ""),
              markup=False, soft_wrap=True)
    t = Table(title_justify="left")
    for col in ("step", "outcome", "status", "geomean", "geomean us", "idea"):
        t.add_column(col)
    for s in steps:
        t.add_row(str(s.index), s.outcome.value, s.result.status.value if s.result else "-",
                  fmt(s.result.geomean_speedup if s.result else None, ".2f", "x"),
                  fmt(s.result.geomean_time_us if s.result else None, ".1f"), s.idea[:80])
    con.print(t)
    if best:
        print_eval(con, best[1])
    for e in store.damage():  # files this view does not read, but resume or report would
        console(stderr=True).print(f"optagent: warning: {e}", markup=False, soft_wrap=True)
    return 0


def cmd_leaderboard(a) -> int:
    from optagent.report.leaderboard import Damaged, as_json, export, gather, print_board

    damaged: list[Damaged] = []
    entries = gather(runs_dir(a.runs_dir), a.task, damaged)
    con = human_console(a)
    err = console(stderr=True)
    for d in damaged:
        err.print(f"optagent: warning: skipped damaged run {d.path.name}: {d.error}", markup=False, soft_wrap=True)
    if a.json:
        print_json(as_json(entries, damaged))
    else:
        print_board(con, entries, diff=a.diff)
    if a.html:
        from optagent.report.board_page import write_leaderboard_html

        con.print(f"wrote {write_leaderboard_html(entries, Path(a.html))}", markup=False)
    if a.export:
        for path in export(entries, Path(a.export)):
            con.print(f"exported {path}", markup=False)
    return 0


def add_run_commands(sub: argparse._SubParsersAction) -> None:
    from optagent.cli.main import add_eval_options

    def runs_opt(p):
        p.add_argument("--runs-dir", help="where runs live (default ./runs or OPTAGENT_RUNS_DIR)")

    r = sub.add_parser("run", help="optimise a task package's kernel: propose, evaluate, keep the best, repeat")
    r.add_argument("dir", help="task package directory")
    add_eval_options(r)
    r.add_argument("--planner", choices=["auto", "llm", "offline", "replay"], default="auto",
                   help="auto: llm when an endpoint is configured, else offline")
    r.add_argument("--replay", metavar="FILE", help="recorded replies for --planner replay")
    r.add_argument("--base-url", help="OpenAI-compatible endpoint (or OPTAGENT_BASE_URL)")
    r.add_argument("--model", help="model name (or OPTAGENT_MODEL); key from OPTAGENT_API_KEY or OPENAI_API_KEY")
    r.add_argument("--min-gain", type=NON_NEGATIVE, default=0.01,
                   help="smallest geomean gain that counts (default 0.01)")
    r.add_argument("--patience", type=PATIENCE, default=5, help="stop after this many steps without gain (default 5)")
    r.add_argument("--max-steps", type=STEPS, default=50,
                   help="at most this many candidates after the starter; 0 evaluates the starter only (default 50)")
    r.add_argument("--time-limit", type=SECONDS, help="stop after this many seconds")
    r.add_argument("--budget-usd", type=NON_NEGATIVE, help="stop once LLM spending reaches this")
    r.add_argument("--quiet", action="store_true")
    r.add_argument("--json", action="store_true", help="print the run id, final state and best result as JSON "
                   "on stdout (everything else goes to stderr)")
    runs_opt(r)
    r.set_defaults(fn=cmd_run)

    s = sub.add_parser("resume", help="continue a stopped or killed run where it stopped")
    s.add_argument("run_id", help="run id, a unique prefix of it, or a run directory's path")
    s.add_argument("--force", action="store_true", help="resume even if the task package changed")
    s.add_argument("--quiet", action="store_true")
    s.add_argument("--json", action="store_true", help="as for run")
    runs_opt(s)
    s.set_defaults(fn=cmd_resume)

    ls = sub.add_parser("runs", help="list runs")
    ls.add_argument("--json", action="store_true", help="print the runs as JSON")
    runs_opt(ls)
    ls.set_defaults(fn=cmd_runs)

    sh = sub.add_parser("show", help="show one run, or one step of it")
    sh.add_argument("run_id", help="run id, a unique prefix of it, or a run directory's path")
    sh.add_argument("--step", type=int)
    sh.add_argument("--json", action="store_true", help="print the run (or the step) as JSON")
    runs_opt(sh)
    sh.set_defaults(fn=cmd_show)

    lb = sub.add_parser("leaderboard", help="best kernel of every run: GPU runs ranked per task, CPU runs apart")
    lb.add_argument("--task", help="only this task")
    lb.add_argument("--json", action="store_true", help="print the ranking as JSON")
    lb.add_argument("--diff", action="store_true", help="print each best kernel as a diff against its starter")
    lb.add_argument("--html", metavar="FILE", help="write the leaderboard as a self-contained HTML page")
    lb.add_argument("--export", metavar="DIR", help="write the best kernel per task in the contest's submit form")
    runs_opt(lb)
    lb.set_defaults(fn=cmd_leaderboard)
