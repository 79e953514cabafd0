"""The one place that picks concrete classes: the evaluator and the planner every command uses.

The loop and the commands see only the protocols (optagent.protocols); what stands behind
them is chosen here, from the command's options or from a run's recorded config.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

from optagent.settings import UserError
from optagent.evaluation.evaluator import TIMEOUT_S, SandboxEvaluator, choose_cases
from optagent.protocols import Evaluator, Memory, Planner, Pool
from optagent.schema import ClusterEngine, Device, PlannerKind, RunConfig
from optagent.search.loop import Limits
from optagent.runs.store import RunStore
from optagent.task import TaskPackage, load_task


def build_evaluator(task: TaskPackage, device: Device, cases: Optional[str], *, hidden: bool = True,
                    timeout_s: float = TIMEOUT_S, compiler: Optional[str] = None,
                    keep_scratch: bool = False, profile: bool = False, target_facts: bool = False) -> Evaluator:
    """The sandboxed evaluator on ``cases`` (a --cases list; None: every contest case on a GPU, the
    smoke cases on the CPU), hidden cases added unless ``hidden`` is off. A bad list is a CaseListError.
    ``profile``: each passing kernel also profiled under ncu (evaluation/profiler.py). ``target_facts``: on a
    CPU, Triton kernels also compiled for the target GPU for their compiler facts (worker/compiler_facts.py)."""
    chosen = choose_cases(task, device, cases, hidden=hidden)
    return SandboxEvaluator(task, device, chosen, timeout_s=timeout_s,
                            compiler=shlex.split(compiler) if compiler else None, keep_scratch=keep_scratch,
                            profile=profile, target_facts=target_facts)


def profile_notice(evaluator: Evaluator) -> str:
    """--profile's one line for a command's output: where ncu is, or that there is none."""
    assert isinstance(evaluator, SandboxEvaluator) and evaluator.profiler is not None
    return evaluator.profiler.notice()


def build_pool(evaluator: Evaluator, jobs: Optional[int] = None, known: Optional[dict] = None,
               config: Optional[RunConfig] = None) -> Pool:
    """What evaluates a run's rounds: the local pool over the sandboxed evaluator, `jobs` evaluations
    at once (default: from the lanes and cores, evaluation/pool.py), one timing lane per visible GPU;
    or, for a run recorded with --cluster ray, the Ray pool: a lane actor per GPU of the cluster, each
    with a local pool of its own (`jobs` at once on each). (evaluation/serial_pool.py, one evaluation
    at a time, serves the loop's own tests.)"""
    from optagent.evaluation.known import KnownFirst
    from optagent.evaluation.pool import LocalPool

    assert isinstance(evaluator, SandboxEvaluator)
    if config is not None and config.cluster is ClusterEngine.RAY:
        check_cluster(config)
        from optagent.evaluation.ray_lane import LaneSpec, pack_task
        from optagent.evaluation.ray_pool import RayPool

        task = evaluator.task
        spec = LaneSpec(task_name=task.root.name, task_digest=task.digest(), device=evaluator.device,
                        cases=evaluator.cases, timeout_s=evaluator.timeout_s, compiler=evaluator.compiler,
                        profile=evaluator.profiler is not None, target_facts=evaluator.target_facts, jobs=jobs)
        pool = RayPool(spec, pack_task(task.root), build_lane_pool, address=config.cluster_address)
        timed_on = None  # the known results were timed here, the cluster's actors are elsewhere
    else:
        pool = LocalPool(evaluator, jobs=jobs)
        timed_on = pool.lane_list[0].name  # timed in this process, on the first visible GPU: lane 0's
    return KnownFirst(pool, known, timed_on) if known else pool


def build_lane_pool(spec, root: Path) -> Pool:
    """A Ray lane actor's own pool (evaluation/ray_lane.py), on its node: the run's evaluator over the
    package unpacked there, one lane (the GPU Ray gave the actor)."""
    from optagent.evaluation.pool import LocalPool

    evaluator = SandboxEvaluator(load_task(root), spec.device, spec.cases, timeout_s=spec.timeout_s,
                                 compiler=spec.compiler, profile=spec.profile, target_facts=spec.target_facts)
    return LocalPool(evaluator, jobs=spec.jobs, devices=[None])


def check_cluster(config: RunConfig) -> None:
    """--cluster ray where Ray is not installed: one line naming the extra, before anything is recorded."""
    if config.cluster is not ClusterEngine.RAY:
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError("--cluster ray needs Ray, which is not installed: pip install 'optagent[cluster]'") from None


def run_evaluator(config: RunConfig, task: TaskPackage) -> Evaluator:
    """A run's evaluator, from its recorded config (the same on resume as at the start)."""
    return build_evaluator(task, config.device, config.cases, hidden=config.hidden, timeout_s=config.timeout_s,
                           compiler=config.compiler, profile=config.profile,
                           target_facts=config.planner in (PlannerKind.LLM, PlannerKind.EXTERNAL))  # who reads them


def run_memory(store: RunStore) -> Memory:
    """The run's link to its task's ledger; opening it backfills the ledger from runs made before it."""
    from optagent.runs.memory import RunMemory

    return RunMemory(store, fresh=store.config.fresh)


def run_limits(config: RunConfig) -> Limits:
    return Limits(min_gain=config.min_gain, patience=config.patience, max_steps=config.max_steps,
                  time_limit_s=config.time_limit_s, budget_usd=config.budget_usd, width=config.width)


def prompt_rules(config: RunConfig, task: TaskPackage):
    """The judge's tolerance (or the task's own check()), the contest's cases and the loop's accept rule,
    as the LLM's prompt states them."""
    from optagent.evaluation.evaluator import probe_task
    from optagent.llm.feedback import Rules, case_sizes, check_source
    from optagent.search.accept import CLEAR_GAIN
    from optagent.task import TaskError

    m = task.manifest if task.manifest and task.manifest.hooks else None
    try:  # cached after the run's first evaluation; a package whose config will not load shows no cases
        cases = tuple(case_sizes(c.index, c.sizes) for c in probe_task(task, cached=True).cases)
    except TaskError:
        cases = ()
    check = None if m else check_source(task.config_path.read_text(encoding="utf-8", errors="replace"))
    return Rules(tolerance_factor=m.tolerance_factor if m else None, min_tolerance=m.min_tolerance if m else None,
                 min_gain=config.min_gain, clear_gain=CLEAR_GAIN, device=config.device.value,
                 contest_cases=cases, check_source=check)


def build_planner(config: RunConfig, task: TaskPackage) -> Planner:
    """The run's planner; an LLM endpoint is asked once here, so that one that cannot answer
    fails the command in milliseconds instead of costing every step its retries."""
    if config.planner is PlannerKind.REPLAY:
        from optagent.search.planners.replay import ReplayPlanner

        try:
            return ReplayPlanner(config.replay_file)
        except ValueError as e:  # names the file
            raise UserError(str(e)) from None
    if config.planner is PlannerKind.LLM:
        from optagent.llm.client import LLMUnreachable, OpenAICompatLLM
        from optagent.llm.config import llm_settings_from_env
        from optagent.search.planners.llm import LLMPlanner

        settings = llm_settings_from_env(config.base_url, config.model)
        if settings is None:
            raise UserError("the LLM planner needs --base-url and --model (or OPTAGENT_BASE_URL/OPTAGENT_MODEL)")
        llm = OpenAICompatLLM(settings.base_url, settings.model, settings.api_key, prices=settings.prices,
                              timeout_s=config.request_timeout_s, max_tokens=config.max_tokens,
                              temperature=config.temperature)
        try:
            llm.check()
        except LLMUnreachable as e:
            raise UserError(str(e)) from None
        return LLMPlanner(llm, rules=prompt_rules(config, task))
    if config.planner is PlannerKind.EXTERNAL:  # an outside agent's run: its rounds come through `propose`
        from optagent.search.planners.external import ExternalPlanner

        return ExternalPlanner()
    if config.planner is not PlannerKind.OFFLINE:  # AUTO is resolved before a run is recorded
        raise UserError(f"run {config.run_id}: no planner {config.planner.value!r}")
    from optagent.search.planners.offline import OfflinePlanner
    from optagent.search.strategy_spec import run_kernel_params

    starter = task.starter(config.language).source
    return OfflinePlanner(config.language, task.manifest.family if task.manifest else None,
                          run_kernel_params(starter), task.strategies_dir)


def resolve_device(arg: Optional[str]) -> Device:
    """--device, or cuda when a GPU is visible, else cpu."""
    from optagent.evaluation.gpus import gpu_visible

    if arg:
        return Device(arg)
    return Device.CUDA if gpu_visible() else Device.CPU
