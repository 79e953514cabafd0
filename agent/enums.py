"""The vocabulary shared by every record: languages, devices, planner kinds, statuses, case kinds."""

from __future__ import annotations

import enum


class Word(str, enum.Enum):
    """A str enum that prints as its value (f-strings, paths, templates), as the plain string did."""

    def __str__(self) -> str:
        return self.value


class Language(str, enum.Enum):
    TRITON = "triton"
    CUDA = "cuda"
    TILELANG = "tilelang"

    @property
    def ext(self) -> str:  # of a source file in this language
        return ".cu" if self is Language.CUDA else ".py"

    @property
    def fence(self) -> str:  # the Markdown code-fence tag of such a source, and which highlighter shows it
        return "cuda" if self is Language.CUDA else "python"


class Device(Word):
    CUDA = "cuda"
    CPU = "cpu"  # Triton's interpreter: shows that kernels work, not how fast they are on a GPU


class PlannerKind(Word):
    AUTO = "auto"  # asked for on the command line only: llm when an endpoint is configured, else offline
    LLM = "llm"
    OFFLINE = "offline"
    REPLAY = "replay"
    EXTERNAL = "external"  # an outside agent proposes, through `optagent propose` or the MCP server


class Status(str, enum.Enum):
    PASSED = "PASSED"
    COMPILE_ERROR = "COMPILE_ERROR"
    INCORRECT = "INCORRECT"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    TIMEOUT = "TIMEOUT"
    UNSUPPORTED = "UNSUPPORTED"
    REJECTED = "REJECTED"  # integrity violation: the kernel tried to cheat
    SKIPPED = "SKIPPED"  # not run because an earlier case already failed

    @property
    def ok(self) -> bool:
        return self is Status.PASSED


# The order in which an evaluation's overall status is chosen from its cases:
# the most damning verdict wins.
SEVERITY = [Status.REJECTED, Status.COMPILE_ERROR, Status.UNSUPPORTED, Status.TIMEOUT, Status.RUNTIME_ERROR,
            Status.INCORRECT, Status.SKIPPED, Status.PASSED]


class FloorKind(Word):
    HOOK = "hook"  # the package's bytes_moved hook
    ESTIMATE = "estimate"  # no hook: every tensor argument moved once (inputs read, outputs written)


class CaseKind(str, enum.Enum):
    CONTEST = "contest"  # the package's own getNumOfTestcases() cases
    SMOKE = "smoke"  # small cases from the manifest, for CPU runs
    HIDDEN = "hidden"  # integrity cases the planner never sees


class RunStatus(str, enum.Enum):
    RUNNING = "RUNNING"
    CONVERGED = "CONVERGED"  # patience ran out
    MAX_STEPS = "MAX_STEPS"
    TIME_LIMIT = "TIME_LIMIT"
    BUDGET = "BUDGET"
    INTERRUPTED = "INTERRUPTED"
    EXHAUSTED = "EXHAUSTED"  # the planner had nothing more to propose
    FAILED = "FAILED"  # no kernel passed, or the planner kept failing
    WAITING = "WAITING"  # an outside agent's run: every proposal evaluated, waiting for the next round


class ClusterEngine(Word):
    """What evaluates a run's candidates (--cluster): this host's pool, or a Ray cluster's actors."""

    LOCAL = "local"
    RAY = "ray"


class TimerKind(Word):
    """What took a verdict's timings (worker/timers.py)."""

    NATIVE = "native"  # worker/native/timer.c: clock, loop and records out of the candidate's reach
    PYTHON = "python"  # bench.Timer in the candidate's interpreter (no C compiler where it ran)


class Phase(str, enum.Enum):
    PROPOSING = "proposing"  # the planner writes the next kernel (an LLM call can take minutes)
    STARTING = "starting"  # a worker process starts and loads the task package
    BASELINE = "baseline"  # timing the task's baseline, case by case
    COMPILING = "compiling"
    CASE = "case"  # running and checking the kernel on a case
    TIMING = "timing"  # timing the kernel on a case
    JUDGING = "judging"  # the trusted judge checks the saved outputs
    PROFILING = "profiling"  # --profile: the passing kernel under ncu


class StepOutcome(str, enum.Enum):
    ACCEPTED = "ACCEPTED"  # became the new best
    NOT_BETTER = "NOT_BETTER"
    FAILED = "FAILED"  # the candidate did not pass
    NO_KERNEL = "NO_KERNEL"  # the planner's reply held no usable kernel
    BASELINE = "BASELINE"  # step 0: the starter
    PASSED = "PASSED"  # passed on the CPU: a node that may be a parent, never the best on a timing
    PENDING = "PENDING"  # passed and faster: decided with its round's comparison (loop.py)

    @property
    def keeps_best(self) -> bool:
        """The step's kernel was the run's best when it was decided (the starter, or an accepted one)."""
        return self in (StepOutcome.ACCEPTED, StepOutcome.BASELINE)

    @property
    def is_node(self) -> bool:
        """A passing kernel of the tree: it may be a parent of later candidates (search/parents.py)."""
        return self in (StepOutcome.BASELINE, StepOutcome.ACCEPTED, StepOutcome.NOT_BETTER, StepOutcome.PASSED)

    @property
    def has_kernel(self) -> bool:
        """A kernel was evaluated and passed (the failures and the replies without a kernel are not)."""
        return self not in (StepOutcome.FAILED, StepOutcome.NO_KERNEL)
