"""The referee: the trusted side of every timed call the candidate process makes (parent side).

The candidate's process builds its inputs, runs the kernel and writes the timer's records: code there can read the
timer's secret, rewrite the records, or choose what is saved. The referee holds what matters outside it. Between two
timed calls the harness asks it (worker/referee_client.py), on a pipe pair whose other ends only the referee holds:

* after a timed call, ``R <call> <set> <digest>``: the digest of its outputs as the call left them
  (worker/digests.py); answered ``S <seed> <keep> <drop>``: the seed the set's inputs are redrawn with
  (drawn here: no inputs exist before the referee reveals them), whether the judge checks this call
  (decided after its digest is committed) and which earlier kept call is let go;
* a warm-up call says ``W <set>`` (``S <seed> 0 -1``); ``B <label> <kind> <n_sets> <n_keep>`` opens a
  loop and ``E`` closes it, each answered ``G``.

Its clock times each window, from its answer to the next question: the call, the harness's work between calls and
anything the process did meanwhile (a thread, work moved out of the call). A loop has one input set (ONE_SET),
redrawn after every call, so each call's work lies in its own window (with two sets, or in the warm-up calls', it
could be done ahead), and the median window is a floor no moving of work lowers, which a stalled window or two does
not raise. The parent holds the timer's records against it (evaluation/verdict.py); the judge checks exactly the
calls kept here, rebuilt from the seeds drawn here, against the digests committed here (worker/judge.py).

A thread of the parent (a process costs a start), timed by a native clock between the worker's pipes and it
(started): its own waits for Python's lock stay out of the windows. Seeds, kept calls and digests on every device;
its clock floors the recorded time on a CPU only (floors_on)."""

from __future__ import annotations

import contextlib
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from statistics import median
from typing import Optional

from optagent.evaluation.native_build import referee_clock
from optagent.messages import ExpectedSample, Job
from optagent.schema import Device
from optagent.settings import REFEREE_FD_ENV
from optagent.timer_records import set_seed, timed_name

SEED_BITS = 40
MAX_LINE = 256  # no question is longer; a longer one is not the harness's
MAX_KEEP = 32  # calls kept for the judge per loop, at most (worker/candidate.py's SAMPLED_CALLS)
MIN_KEEP = 2  # and at least (a kernel that says its outputs are too large to keep many is still checked)
ONE_SET = 1  # input sets of a refereed loop (above): the CPU's TimingSpec (evaluation/evaluator.py)
QUESTION = {
    "B": re.compile(r"B (\S{1,64}) (baseline|eager) (\d{1,2}) (\d{1,3})"),
    "W": re.compile(r"W (\d{1,2})"),
    "R": re.compile(r"R (\d{1,7}) (\d{1,2}) ([0-9a-f]{64})"),
    "E": re.compile(r"E"),
}


@dataclass
class KeptCall:
    """A timed call the judge checks: its set, its inputs' seed (None: the base inputs), its outputs' digest."""

    call: int
    set: int
    seed: Optional[int]
    digest: str


@dataclass
class RefereeLoop:
    label: str
    baseline: bool
    n_sets: int
    windows_us: list[float] = field(default_factory=list)  # one per timed call
    kept: dict[int, KeptCall] = field(default_factory=dict)
    closed: bool = False
    keep_target: int = MIN_KEEP  # its reservoir (_reservoir): how many calls it keeps, and how many it has seen
    seen: int = 0

    @property
    def median_us(self) -> Optional[float]:
        return median(self.windows_us) if self.windows_us else None


class Referee:
    """One per candidate (or baseline) process: its pipes, a thread answering them, and the log."""

    def __init__(self) -> None:
        self._q_r, self._q_w = os.pipe()  # questions: the worker writes, the referee reads
        self._a_r, self._a_w = os.pipe()  # answers: the referee writes, the worker reads
        self.loops: list[RefereeLoop] = []
        self.violation: Optional[str] = None
        self._rng = random.SystemRandom()
        self._seeds: dict[tuple[str, bool], list[Optional[int]]] = {}  # the inputs each set holds now
        self._thread: Optional[threading.Thread] = None
        self._relay: Optional[threading.Thread] = None  # the native clock (started): questions come stamped

    @property
    def child_fds(self) -> tuple[int, int]:
        return self._a_r, self._q_w

    @property
    def env(self) -> dict[str, str]:
        return {REFEREE_FD_ENV: f"{self._a_r},{self._q_w}"}

    def started(self) -> None:
        """The worker holds its ends now: ours of theirs are closed, and the thread starts answering; with the
        native clock (timer.c's, native_build.referee_clock) between the worker's pipes and the thread."""
        os.close(self._a_r)
        os.close(self._q_w)
        clock = referee_clock()
        if clock is not None:  # questions with their windows clock -> thread; answers thread -> clock
            (stamped_r, stamped_w), (answer_r, answer_w) = os.pipe(), os.pipe()
            self._relay = threading.Thread(target=clock, args=(self._q_r, self._a_w, stamped_w, answer_r),
                                           name="referee-clock", daemon=True)  # it closes those four when done
            self._q_r, self._a_w = stamped_r, answer_w
            self._relay.start()
        self._thread = threading.Thread(target=self._serve, name="referee", daemon=True)
        self._thread.start()

    def abandon(self) -> None:
        for fd in (self._q_r, self._q_w, self._a_r, self._a_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def finish(self, wait_s: float = 5.0) -> "Referee":
        """After the worker ended: the threads see the questions' end and stop (each closes its own ends)."""
        for thread in (self._relay, self._thread):
            if thread is not None:
                thread.join(wait_s)
        return self

    def loop(self, label: str, baseline: bool) -> Optional[RefereeLoop]:
        """The first closed loop of this case and kind (a slow host's retry is a second one)."""
        return next((lp for lp in self.loops if lp.label == label and lp.baseline is baseline and lp.closed), None)

    # ------------------------------------------------------------------ the thread

    def _serve(self) -> None:
        reader = os.fdopen(self._q_r, "rb", buffering=0)
        pending = b""
        answered = time.perf_counter()
        try:
            while True:
                chunk = reader.read(MAX_LINE)
                if not chunk:
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    heard = time.perf_counter()
                    window_us = (heard - answered) * 1e6
                    if self._relay is not None:  # "<window us> <question>": the native clock's, not this thread's
                        stamp, _, line = line.partition(b" ")
                        window_us = float(stamp)
                    answer = self._answer(line, window_us)
                    if answer is None:
                        return  # a violation: no more answers; the worker's next question finds the pipe closed
                    os.write(self._a_w, answer.encode() + b"\n")
                    answered = time.perf_counter()
                if len(pending) > MAX_LINE + 32:  # (32: the clock's stamp)
                    self._violate("a question to the referee longer than any the harness asks")
                    return
        except OSError as e:
            self._violate(f"the referee's pipe failed: {e}")
        finally:
            reader.close()
            with contextlib.suppress(OSError):
                os.close(self._a_w)  # the worker's next question finds the pipe closed

    def _violate(self, why: str) -> None:
        if self.violation is None:
            self.violation = why

    def _answer(self, raw: bytes, window_us: float) -> Optional[str]:
        text = raw.decode("ascii", errors="replace")
        kind = text[:1]
        m = QUESTION[kind].fullmatch(text) if kind in QUESTION else None
        if m is None:
            self._violate(f"the referee was asked something the harness never asks ({text[:40]!r})")
            return None
        open_loop = self.loops[-1] if self.loops and not self.loops[-1].closed else None
        if kind == "B":
            if open_loop is not None:
                self._violate("a timed loop was opened inside another")
                return None
            label, which, n_sets, n_keep = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
            if n_sets != ONE_SET:
                self._violate(f"a timed loop over {n_sets} input sets; a refereed loop redraws one before every call")
                return None
            lp = RefereeLoop(label, which == "baseline", n_sets, keep_target=min(MAX_KEEP, max(MIN_KEEP, n_keep)))
            self._seeds.setdefault((label, lp.baseline), [None] * n_sets)
            self.loops.append(lp)
            return "G"
        if open_loop is None:
            self._violate("a timed call outside any timed loop")
            return None
        seeds = self._seeds[(open_loop.label, open_loop.baseline)]
        if kind == "E":
            open_loop.closed = True
            return "G"
        k = int(m.group(2) if kind == "R" else m.group(1))
        if not 0 <= k < open_loop.n_sets:
            self._violate(f"a timed call on input set {k}, which the harness does not have")
            return None
        keep, drop = False, -1
        if kind == "R":
            call = int(m.group(1))
            if call != len(open_loop.windows_us):
                self._violate(f"timed call {call} reported out of order")
                return None
            open_loop.windows_us.append(window_us)
            if not open_loop.baseline:
                keep, drop = self._reservoir(open_loop, KeptCall(call, k, seeds[k], m.group(3)))
        seed = self._rng.getrandbits(SEED_BITS)
        seeds[k] = seed
        return f"S {seed} {int(keep)} {drop}"

    def _reservoir(self, lp: RefereeLoop, entry: KeptCall) -> tuple[bool, int]:
        """Reservoir sampling over the loop's calls, by this process's randomness: (keep, call let go)."""
        lp.seen += 1
        if len(lp.kept) < lp.keep_target:
            lp.kept[entry.call] = entry
            return True, -1
        if self._rng.random() < lp.keep_target / lp.seen:
            drop = self._rng.choice(sorted(lp.kept))
            del lp.kept[drop]
            lp.kept[entry.call] = entry
            return True, drop
        return False, -1


# ---------------------------------------------------------------------- what the log says

# The timer's claim (its median of the calls alone) beside the referee's figure (its median window less the harness's
# own share). The recorded time is never far below that figure (floor_us); a claim this far below it was forged:
# rejected. Far, as a window also holds what the host did to the process meanwhile (a loaded CPU's scheduling).
FORGED = (4.0, 20_000.0)  # (times the claim, and microseconds more)


def over_us(referee: Optional[Referee], label: str, baseline_claim_us: Optional[float]) -> Optional[float]:
    """The harness's own time per call under the referee, beyond the timed call: the baseline loop's median
    window less the baseline's median (that loop ran before any candidate code existed in its process)."""
    lp = referee.loop(label, True) if referee else None
    if lp is None or lp.median_us is None or baseline_claim_us is None:
        return None
    return max(0.0, lp.median_us - baseline_claim_us)


def unrefereed(referee: Referee, timed: list[str]) -> Optional[str]:
    """Why the referee's log does not cover the timed cases (a question out of turn, a loop not made), or None."""
    if referee.violation:
        return f"the referee stopped answering: {referee.violation}"
    for label in timed:
        lp = referee.loop(label, False)
        if lp is None or not lp.windows_us or not lp.kept:
            return f"case {label}: its timed calls were not made under the referee (the harness's loop did not run)"
    return None


# The referee's figure is a difference of two medians, each moving with the host: a claim this close under it stands,
# a lower one is recorded at floor_us. What a forger can gain is this much, no more.
RESOLUTION = (0.03, 2.0)  # (a share of the figure, and microseconds more)


def floors_on(device: Device) -> bool:
    """Whether the figure floors the recorded time: on a CPU. On an H200 a window's share of the harness's own work
    (redraw, flush, digest: 0.5-9 ms a decode call) differed by 10-50% between processes (docs/gpu.md, 2026-12-03):
    there the figure is only recorded (referee_us), and a FORGED claim fails."""
    return device is Device.CPU


def floor_us(seen: float) -> float:
    """The least time recorded for a call the referee's clock saw take `seen` microseconds."""
    share, us = RESOLUTION
    return max(0.0, seen * (1.0 - share) - us)


def seen_us(lp: RefereeLoop, over: Optional[float]) -> Optional[float]:
    """The referee's time a call: its median window less the harness's own share (None: not calibrated)."""
    return None if over is None or lp.median_us is None else max(0.0, lp.median_us - over)


def forged_claim(label: str, lp: RefereeLoop, claim_us: float, over: Optional[float]) -> Optional[str]:
    """Why the timer's claim for this loop is far shorter than the referee's clock allows, or None."""
    seen = seen_us(lp, over)
    factor, more_us = FORGED
    if seen is not None and seen > claim_us * factor + more_us:
        return (f"case {label}: the timer's records give {claim_us:.0f} us a call, but the referee's own clock saw {seen:.0f}"
                f" us a call ({lp.median_us:.0f} us its median window, less {over:.0f} us of the harness's own work): the "
                "timing was not the harness's")
    return None


def expected_calls(job: Job, referee: Referee, timed: list[str]) -> dict[str, list[ExpectedSample]]:
    """The timed calls the judge checks: those the referee kept, with its seeds and the digests told to it."""
    out: dict[str, list[ExpectedSample]] = {}
    for label in timed:
        lp = referee.loop(label, False)
        out[label] = [ExpectedSample(name=timed_name(c.call), base_seed=set_seed(job, c.set), refresh_seed=c.seed,
                                     digest=c.digest) for c in (lp.kept.values() if lp else ())]
    return out
