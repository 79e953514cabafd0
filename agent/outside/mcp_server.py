"""``optagent mcp``: the operations of outside/ as MCP tools over stdio (the official ``mcp`` SDK).

The tools' docstrings are their descriptions: an agent reads nothing else, so each says what
goes in, what comes back, and what the verdicts mean. Evaluations block for seconds to minutes;
they run in a worker thread, and every phase they enter is sent as a progress notification.
A bad input is a tool error with one line; a bad kernel is a verdict.
"""

from __future__ import annotations

import time
from typing import Annotated, Callable, Optional, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from optagent.app import operations as ops
from optagent.app import steps as run_ops
from optagent.progress import Progress

T = TypeVar("T")

Task = Annotated[str, Field(description="a task package this server offers: its folder name (see the "
                                        "server's instructions) or the path it was started with")]
Lang = Annotated[Optional[str], Field(description="cuda, triton or tilelang; default: the package's first")]
Source = Annotated[str, Field(description="the kernel's whole source text, defining run_kernel as the "
                                          "language's contract says (not a file path, not a diff)")]
Cases = Annotated[Optional[str], Field(description="contest case numbers, e.g. '1,3-5'; default: every "
                                                   "contest case on a GPU, the smoke cases on the CPU")]
RunId = Annotated[str, Field(description="a run id, as start_run returned it")]

INSTRUCTIONS = (
    "optagent evaluates GPU kernels for contest task packages in a sandbox (compile, check against a float64 "
    "reference with fresh inputs and hidden cases, time against the package's baseline) and keeps runs: "
    "rounds of kernels with a noise-aware accept rule, a best kernel, a leaderboard. Start with task_info; "
    "evaluate a kernel with evaluate; or start_run, then propose rounds and read the feedback they return.")


def build_server(scope: ops.Scope) -> MCPServer:
    server = MCPServer("optagent", instructions=INSTRUCTIONS + " Tasks offered: "
                       + ", ".join(t.name for t in scope.tasks) + f". Runs directory: {scope.runs_dir}.")

    async def blocking(ctx: Context, work: Callable[[Optional[Callable[[Progress], None]]], T]) -> T:
        """Runs work(progress) in a thread; its progress events become MCP progress notifications."""
        from optagent.progress import describe

        started, count = time.monotonic(), 0

        def progress(event: Progress) -> None:
            nonlocal count
            count += 1
            text = describe(event, time.monotonic() - started, 0.0)
            try:
                anyio.from_thread.run(ctx.report_progress, count, None, text)
            except Exception:  # a client that asked for no progress, or left: the work goes on
                pass

        try:
            return await anyio.to_thread.run_sync(lambda: work(progress))
        except (ops.OutsideError, run_ops.RunOpError) as e:
            raise ToolError(str(e)) from None  # its text reaches the agent; any other exception stays opaque

    @server.tool()
    def task_info(task: Task, language: Lang = None) -> ops.TaskInfo:
        """The task: its statement, the interface contract of each language (or the one asked for), the
        contest cases with their sizes, which run_kernel arguments are outputs, the baseline the speedups
        are measured against, and the starter kernels' sources. Read it before writing a kernel."""
        try:
            return ops.task_info(scope, task, language)
        except ops.OutsideError as e:
            raise ToolError(str(e)) from None

    @server.tool()
    async def evaluate(task: Task, source: Source, ctx: Context, language: Lang = None,
                       cases: Cases = None) -> ops.Verdict:
        """Compile, check and time one kernel, exactly as `optagent eval` does; records nothing. status is
        PASSED only when every case passed; otherwise COMPILE_ERROR, INCORRECT (wrong outputs: the reason
        names the case and the error against the tolerance), RUNTIME_ERROR, TIMEOUT, REJECTED (the sandbox
        refused it: e.g. it called a library instead of computing, or tampered with the harness) or
        UNSUPPORTED. result holds every case's time, speedup and % of the floor; table is the same as text.
        Progress notifications follow the phases (compiling, each case, timing, judging)."""
        return await blocking(ctx, lambda progress: ops.evaluate(scope, task, source, language, cases, progress))

    @server.tool()
    async def start_run(task: Task, ctx: Context, language: Lang = None,
                        max_steps: Annotated[int, Field(ge=0, description="at most this many candidates "
                                                        "after the starter")] = 50) -> run_ops.Feedback:
        """Create a run driven by you (planner 'external') and evaluate its starter, which becomes the
        baseline of the run's speedups and its first best kernel. Returns the run id and the feedback a
        planner would be shown next. Then call propose with your kernels."""
        return await blocking(ctx, lambda progress: run_ops.start_run(scope, task, language, max_steps, progress))

    @server.tool()
    async def propose(run_id: RunId, ctx: Context,
                      sources: Annotated[list[str], Field(min_length=1, max_length=16, description="one round: "
                                                          "each an attempt in the prompt's reply format (the IDEA: "
                                                          "line, then SEARCH/REPLACE blocks against its parent's "
                                                          "kernel, or the whole file in a fenced code block) or a "
                                                          "raw kernel source")],
                      ideas: Annotated[Optional[list[str]], Field(description="one short idea per source, "
                                                                  "in the same order")] = None,
                      parent: Annotated[Optional[int], Field(description="the step each source was derived "
                                                             "from (its SEARCH/REPLACE blocks apply to that step's "
                                                             "kernel); default: the kernel the feedback names")] = None
                      ) -> run_ops.Feedback:
        """Evaluate the sources as one round of the run, record every one as a step, and apply the same
        accept rule `optagent run` applies (a candidate replaces the best only when faster by more than the
        minimum gain and the timing noise, re-timed back to back with the best when close; on a CPU run,
        never on a timing). Returns each step's verdict, whether the best changed, and the feedback a
        planner would be shown next (failures with their details, the best kernel's table)."""
        return await blocking(ctx, lambda progress: run_ops.propose(scope, run_id, sources, ideas, parent, progress))

    @server.tool()
    def run_status(run_id: RunId) -> run_ops.RunStatusView:
        """A run: its status, every step (idea, outcome, verdict, geomean), the best kernel's source and
        per-case table, and the lineage of the best kernel (the steps it was derived through)."""
        return _sync(lambda: run_ops.run_status(scope, run_id))

    @server.tool()
    def leaderboard(task: Annotated[Optional[str], Field(description="only this task's runs")] = None
                    ) -> run_ops.Board:
        """The best kernel of every run in the runs directory: GPU runs ranked per task by geomean speedup,
        CPU runs listed apart (their times are the interpreter's, not GPU timings)."""
        return _sync(lambda: run_ops.leaderboard(scope, task))

    @server.tool()
    def export(run_id: RunId) -> run_ops.Export:
        """The run's best kernel in the contest's submit form: the file a contestant submits and its
        measured result, written under the runs directory's export/ folder; the source comes back too."""
        return _sync(lambda: run_ops.export(scope, run_id))

    return server


def _sync(work: Callable[[], T]) -> T:
    try:
        return work()
    except (ops.OutsideError, run_ops.RunOpError) as e:
        raise ToolError(str(e)) from None


def serve(scope: ops.Scope) -> None:
    anyio.run(build_server(scope).run_stdio_async)
