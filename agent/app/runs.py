"""A run, assembled and driven in one place: what it is asked to do (RunRequest, every default once), its
record (create_run: the one RunConfig construction), driving it (drive: lock, memory, the loop, the pool
closed, the lock dropped), handing it to another planner (hand_over), and what a planner would be told
next (next_prompt: read from the run held in memory, no loop needed).

`optagent run`/`resume`, step mode and the MCP tools all come here; they only adapt options and output.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from pydantic import BaseModel, ConfigDict, Field

from optagent.app.build import build_planner, check_cluster, prompt_rules, run_memory
from optagent.evaluation.evaluator import TIMEOUT_S
from optagent.progress import ProgressSink
from optagent.protocols import Planner, Pool
from optagent.runs import view
from optagent.runs.store import RunStore, new_run_id
from optagent.runs.files import RunError
from optagent.runs.trajectory import Trajectory
from optagent.schema import ClusterEngine, Device, Language, PlannerKind, RunConfig, RunState, Step
from optagent.search import rounds
from optagent.search.loop import Limits, Loop
from optagent.settings import UserError
from optagent.task import TaskPackage

_LIMITS = Limits()  # the loop's own defaults, named once there


class RunRequest(BaseModel):
    """What a user (or an outside agent) asks of a new run. The defaults here are every entry point's."""

    model_config = ConfigDict(extra="forbid")

    device: Device
    planner: PlannerKind = PlannerKind.OFFLINE
    language: Optional[Language] = None  # None: the caller chose none (pick_language decides for `run`)
    language_reason: Optional[str] = None
    model: Optional[str] = None
    base_url: Optional[str] = None
    replay_file: Optional[str] = None
    compiler: Optional[str] = None
    request_timeout_s: float = RunConfig.model_fields["request_timeout_s"].default  # per LLM request
    max_tokens: Optional[int] = None
    temperature: Optional[float] = None
    cases: Optional[str] = None
    hidden: bool = True
    fresh: bool = False
    profile: bool = False
    timeout_s: float = TIMEOUT_S
    min_gain: float = _LIMITS.min_gain
    patience: int = _LIMITS.patience
    max_steps: int = _LIMITS.max_steps
    width: int = Field(_LIMITS.width, ge=1)
    time_limit_s: Optional[float] = _LIMITS.time_limit_s
    budget_usd: Optional[float] = _LIMITS.budget_usd
    cluster: ClusterEngine = ClusterEngine.LOCAL
    cluster_address: Optional[str] = None

    def config(self, task: TaskPackage) -> RunConfig:
        """The run's record: the one place a RunConfig is made from a request."""
        if self.language is None:
            raise UserError(f"{task.root}: no language chosen for the run")
        fields = self.model_dump()
        if self.planner is PlannerKind.EXTERNAL:  # an outside agent decides when its run ends
            fields["patience"] = self.max_steps + 1
        return RunConfig(run_id=new_run_id(task.name), task_dir=str(task.root), task_name=task.name,
                         task_digest=task.digest(), **fields)


def create_run(root: Path, task: TaskPackage, config: RunConfig) -> RunStore:
    """A new run under `root` (config: RunRequest.config), its config and starter recorded."""
    return RunStore.create(root, config, task.starter(config.language).source)


@dataclass
class Driven:
    state: RunState
    new_steps: list[Step]  # the steps this drive committed


def drive(store: RunStore, task: TaskPackage, planner: Planner, pool: Pool, *,
          on_step: Callable[[Step, RunState], None] = lambda s, st: None,
          progress: Optional[ProgressSink] = None, width: Optional[int] = None,
          on_start: Callable[[object], None] = lambda memory: None, started: Optional[float] = None) -> Driven:
    """Runs the loop until it stops; the pool is closed and the run unlocked whatever happens.
    width: a round's size other than the run's (an outside agent's round is the sources it handed in).
    started: when the time limit's clock started (time.monotonic(): the command's start); None: now.
    on_start hears the run's memory once the lock is held (the CLI prints its summary)."""
    cfg = store.config
    try:
        store.lock()
    except BaseException:
        pool.close()
        raise
    try:
        memory = run_memory(store)
        on_start(memory)
        limits = Limits(min_gain=cfg.min_gain, patience=cfg.patience, max_steps=cfg.max_steps,
                        time_limit_s=cfg.time_limit_s, budget_usd=cfg.budget_usd, width=width or cfg.width,
                        started=started)
        loop = Loop(store, task, planner, pool, limits, on_step, progress=progress, memory=memory)
        state = loop.run()
    finally:
        pool.close()
        store.unlock()
    return Driven(state, [s for s in loop.trajectory.steps if s.index not in loop.loaded])


def preflight(task: TaskPackage, config: RunConfig) -> Planner:
    """Everything step 0 would otherwise find out the slow way; returns the run's planner."""
    from optagent.evaluation.evaluator import probe_task
    from optagent.settings import settings

    settings()  # every OPTAGENT_* value checked before the run starts
    check_cluster(config)  # Ray missing: one line before the run exists
    planner = build_planner(config, task)  # an LLM endpoint is checked here: milliseconds, the probe takes seconds
    probe_task(task, cached=True)  # a package that does not load is a TaskError; only a good probe is cached
    return planner


def hand_over(store: RunStore, task: TaskPackage, *, planner: Optional[PlannerKind] = None,
              replay: Optional[str] = None, base_url: Optional[str] = None, model: Optional[str] = None,
              cluster: Optional[tuple[ClusterEngine, Optional[str]]] = None) -> RunConfig:
    """resume --planner/--task/--cluster: the run goes on with another planner, on another pool, or from
    the package's new place; the changed config is recorded before the run goes on."""
    from optagent.llm.config import llm_settings_from_env

    cfg = store.config
    changes: dict = {}
    if cluster is not None and cluster != (cfg.cluster, cfg.cluster_address):
        changes.update(cluster=cluster[0], cluster_address=cluster[1])
    if str(task.root) != cfg.task_dir:
        changes["task_dir"] = str(task.root)
    if planner is not None and planner is not cfg.planner:
        if planner is PlannerKind.AUTO:
            raise UserError("resume --planner: name the planner (llm, offline, replay or external)")
        llm = llm_settings_from_env(base_url, model) if planner is PlannerKind.LLM else None
        if planner is PlannerKind.REPLAY and not replay:
            raise UserError("--planner replay needs --replay FILE")
        changes.update(planner=planner, model=llm.model if llm else None, base_url=llm.base_url if llm else None,
                       replay_file=str(Path(replay).resolve()) if replay else None)
        if planner is PlannerKind.EXTERNAL:
            changes["patience"] = cfg.max_steps + 1
    if changes:
        cfg = cfg.model_copy(update=changes)
        check_cluster(cfg)  # Ray missing: the run's config stays as it was
        store.save_config(cfg)
    return cfg


def next_context(store: RunStore, task: TaskPackage, traj: Optional[Trajectory] = None) -> view.PlannerContext:
    """What the planner would be given next: the next round's first slot, read from the run's files."""
    traj = traj or Trajectory.load(store)
    memory = run_memory(store)
    parents = rounds.round_parents(traj, store.config, 1)
    return view.contexts(task, store.config, traj, traj.next_index, parents, memory.recall())[0]


def next_prompt(store: RunStore, task: TaskPackage) -> str:
    """The messages the LLM planner would be sent next (system, then user), with the rules it states (the judge's
    tolerance, the accept rule): what step mode and the MCP tools show an outside agent."""
    from optagent.search.planners.llm import build_messages

    if store.state() is None:
        raise RunError(f"{store.path}: the run has no state yet (its starter was never evaluated)")
    # the system message too: its rules and the reply format (the SEARCH/REPLACE markers) are what propose reads
    ctx = next_context(store, task)
    # the other kernels a FILE@STEP may build on: after a round of several, "the newest" is one of many
    passing = [a.index for a in ctx.attempts if a.result is not None and a.result.status.ok and a.source
               and a.index != ctx.parent_step and a.index != 0]
    system, user = build_messages(ctx, rules=prompt_rules(store.config, task),
                                  hand_in={"run_id": store.config.run_id, "other_passing": passing,
                                           "sources": str(store.step_dir(0).parent / f"NNNN/candidate{store.config.language.ext}")})
    return system["content"].rstrip("\n") + "\n\n" + user["content"]
