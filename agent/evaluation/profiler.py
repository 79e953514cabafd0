"""--profile: each passing candidate profiled once under Nsight Compute, in the candidate's sandbox.

The profile process is candidate code, so it runs like every worker (sandbox.py, isolation.py:
bwrap as uid 65534, the limits, a fresh scratch directory, an environment without keys), with
ncu as the program inside: ``bwrap ... -- ncu --clock-control none --csv --page raw
--profile-from-start off --metrics ... --log-file SCRATCH/ncu.csv python -m optagent.worker ...``.
ncu never locks the clocks (the timings of other evaluations run at the GPU's own). The CSV is
read here (ncu_csv.py), bounded and defensively; it feeds the prompt and ``show``, never a
verdict or a ranking. On a pool the process holds its GPU's timing lane, so that no other
evaluation times beside ncu's replays.

Where ncu is missing, or cannot read the counters (a restricted driver, a gVisor machine), every
profile says so in its status and the run's output says it once; the run goes on unprofiled.
"""

from __future__ import annotations

import glob
import os
import shutil
import threading
from pathlib import Path
from typing import Callable, Optional

from optagent.evaluation import ncu_csv
from optagent.evaluation.gates import Control, Gate
from optagent.evaluation.lanes import OrderedLane
from optagent.evaluation.safe_files import read_regular
from optagent.evaluation.sandbox import WorkerRun, run_worker
from optagent.evaluation.scratch import new_scratch, remove_scratch
from optagent.messages import CaseSpec, CaseStart, Job, WorkerError
from optagent.profile_facts import CaseProfile, ProfileStatus
from optagent.schema import CaseKind, Device, EvalResult, Language
from optagent.settings import NCU_ENV, EnvError, settings

PLACES = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu")
NOT_FOUND = (f"ncu (Nsight Compute) was not found on PATH, in /usr/local/cuda/bin or /opt/nvidia/nsight-compute "
             f"({NCU_ENV} names it)")
CSV_NAME = "ncu.csv"
MakeJob = Callable[..., Job]


def find_ncu() -> Optional[Path]:
    """The ncu setting (an EnvError when it names no program), else ncu on PATH or where CUDA puts it."""
    raw = (settings().ncu or "").strip()
    if raw:
        path = Path(raw).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise EnvError(f"{NCU_ENV}={raw!r}: not an executable file")
        return path.absolute()
    found = shutil.which("ncu")
    if found:
        return Path(found).absolute()
    for pattern in PLACES:
        hits = sorted(p for p in glob.glob(pattern) if os.access(p, os.X_OK))
        if hits:
            return Path(hits[-1])  # the newest version folder sorts last
    return None


def ncu_argv(ncu: Path, csv_path: Path) -> list[str]:
    return [str(ncu), "--clock-control", "none", "--csv", "--page", "raw", "--profile-from-start", "off",
            "--metrics", ",".join(ncu_csv.METRICS), "--log-file", str(csv_path)]


def _read_bounded(path: Path) -> str:
    # in the candidate's scratch directory: no link followed, no FIFO waited on (evaluation/safe_files.py)
    return read_regular(path, ncu_csv.MAX_BYTES + 1).decode("utf-8", errors="replace")


class Profiler:
    """One per evaluator: finds ncu once, profiles each source once, and stops trying for the
    rest of the run once ncu has said the counters cannot be read."""

    def __init__(self, ncu: Optional[Path]):
        self.ncu = ncu
        self.blocked: Optional[CaseProfile] = None if ncu else CaseProfile(status=ProfileStatus.NO_NCU,
                                                                             reason=NOT_FOUND)
        self._done: dict[str, dict[str, CaseProfile]] = {}  # source sha256 -> case label -> its profile
        self._lock = threading.Lock()

    @classmethod
    def found(cls) -> "Profiler":
        return cls(find_ncu())

    def notice(self) -> str:
        """The run's one line on profiling."""
        if self.ncu is None:
            return f"profile: {NOT_FOUND}: no profiles"
        return (f"profile: each passing candidate runs once more per case under {self.ncu} "
                "(--clock-control none), in the same sandbox")

    def attach(self, result: EvalResult, source: str, language: Language, make_job: MakeJob, timeout_s: float,
               scratch_root: Optional[Path], gate: Optional[Control], control: Optional[Control]) -> EvalResult:
        """result with each shown case's profile: from this source's earlier profile, or a new one."""
        shown = [c for c in result.cases if c.kind is not CaseKind.HIDDEN]
        if not shown:
            return result
        with self._lock:
            known, blocked = self._done.get(result.source_sha256), self.blocked
        if known is None and blocked is None:
            known = self._profile(source, language, make_job, timeout_s, scratch_root, gate, control, result.device)
            with self._lock:
                self._done[result.source_sha256] = known
                stuck = next((p for p in known.values() if p.status is ProfileStatus.NO_COUNTERS), None)
                self.blocked = self.blocked or stuck
        cases = []
        for c in result.cases:
            p = None if c.kind is CaseKind.HIDDEN else (known.get(c.case) if known is not None else blocked)
            if p is not None and p.status is ProfileStatus.PROFILED:
                floor = c.hw_floor_us
                p = p.model_copy(update={"floor_pct": 100.0 * floor / p.duration_us
                                         if floor and p.duration_us else None})
            cases.append(c.model_copy(update={"profile": p}))
        return result.model_copy(update={"cases": cases})

    def _profile(self, source: str, language: Language, make_job: MakeJob, timeout_s: float,
                 scratch_root: Optional[Path], gate: Optional[Control], control: Optional[Control],
                 device: Device) -> dict[str, CaseProfile]:
        assert self.ncu is not None
        scratch, nonce = new_scratch(scratch_root)
        try:
            src = scratch / f"candidate{language.ext}"
            src.write_text(source, encoding="utf-8")
            job = make_job("profile", scratch, nonce, language=language, source_path=str(src))
            job = job.model_copy(update={"cases": [s for s in job.cases if s.kind is not CaseKind.HIDDEN]})
            control = Control(control.device, control.stop) if control else Control()
            control.env["HOME"] = str(scratch)  # ncu keeps its settings under HOME, read-only in the sandbox
            lane = gate.lane if isinstance(gate, Gate) and not isinstance(gate.lane, OrderedLane) else None
            who = ("profile", object())
            if lane is not None:  # ncu's replays would disturb another evaluation timing on this GPU
                lane.acquire(who)
            try:
                run = run_worker(job, timeout_s, control=control, prefix=ncu_argv(self.ncu, scratch / CSV_NAME))
            finally:
                if lane is not None:
                    lane.release(who)
            text = _read_bounded(scratch / CSV_NAME)
        finally:
            remove_scratch(scratch)
        return read_profiles(job.cases, run, text, device)


def read_profiles(cases: list[CaseSpec], run: WorkerRun, text: str, device: Device) -> dict[str, CaseProfile]:
    """Each profiled case's CaseProfile from the profile process's run and ncu's CSV."""
    labels = [c.label for c in cases]

    def every(status: ProfileStatus, reason: str) -> dict[str, CaseProfile]:
        return {label: CaseProfile(status=status, reason=reason) for label in labels}

    said = ncu_csv.diagnose(text + "\n" + run.stderr_tail)
    if said and said[0] is ProfileStatus.NO_COUNTERS:
        return every(*said)
    error = run.first(WorkerError)
    if error or run.timed_out or run.limit:
        why = error.error if error else (run.limit or run.exit_text)
        return every(ProfileStatus.FAILED, f"the profile process failed: {why}"[:400])
    try:
        launches = ncu_csv.parse(text)
    except ncu_csv.CsvError as e:
        return every(ProfileStatus.FAILED, str(e))
    if not launches:
        if device is Device.CPU:  # said for the run once, and not asked again
            return every(ProfileStatus.NO_COUNTERS, "ncu profiled no kernel: a CPU run has no GPU counters")
        if said:
            return every(*said)
        return every(ProfileStatus.FAILED, f"ncu profiled no kernel (the profile process {run.exit_text})")
    order = []  # the cases in the order the process ran them; forged or repeated labels count for nothing
    for m in run.all(CaseStart):
        if m.case in labels and m.case not in order:
            order.append(m.case)
    order = order if len(order) == len(labels) else labels
    groups = ncu_csv.split_cases(launches)
    if len(groups) != len(order):
        return every(ProfileStatus.FAILED, f"ncu's kernels split into {len(groups)} groups for {len(order)} cases")
    return {label: ncu_csv.summarise(group) for label, group in zip(order, groups)}
