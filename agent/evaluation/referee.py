"""The referee: the trusted side of every timed call the candidate process makes (parent side).

The candidate's process builds its inputs, runs the kernel and writes the timer's records: code there can read the
timer's secret, rewrite the records, or choose what is saved. The referee holds what matters outside it. Between two
timed calls the harness asks it (worker/referee_client.py), on a pipe pair whose other ends only the referee holds:

* after a timed call, ``R <call> <set> <digest>``: the digest of its outputs as the call left them
  (worker/digests.py); answered ``S <seed> <keep> <drop>``: the seed the set's inputs are redrawn with
  (drawn here: no inputs exist before the referee reveals them), whether the judge checks this call
  (decided after its digest is committed) and which earlier kept call is let go: by the native clock, where
  there is one, which tells the thread what it answered (a busy parent's Python lock stays out of the loop);
* just before a timed call ``T`` and just after its sync ``D`` (the native timer's marks, worker/native/timer.c),
  each answered ``G`` at once;
* a warm-up call says ``W <set>`` (``S <seed> 0 -1``); ``B <label> <kind> <n_sets> <n_keep>`` opens a
  loop and ``E`` closes it, each answered ``G``.

Its clock times each window, from its answer to the next question. A call's window (T's answer to D) holds the call
and its sync; the time between two calls (D's answer to the next T) holds the harness's digest, redraw and flush,
and whatever work the process moved there. A loop has one input set (ONE_SET), redrawn after every call, so no
call's work can be done before its inputs exist (with two sets, or in the warm-up calls', it could be done ahead):
it lies in its call's window or in the time between. The parent holds the timer's records against the call windows'
low quartile and the time between against the same loop's in a trusted process (the baseline's; evaluation/
referee_log.py); the
judge checks exactly the calls kept here, rebuilt from the seeds drawn here, against the digests committed here
(worker/judge.py).

A thread of the parent (a process costs a start), timed by a native clock between the worker's pipes and it
(started): its own waits for Python's lock stay out of the windows. Seeds, kept calls, digests and the clock's floor
under the recorded time hold on every device."""

from __future__ import annotations

import contextlib
import os
import random
import re
import threading
import time
from typing import Optional

from optagent.evaluation.native_build import referee_clock
from optagent.evaluation.referee_loops import MAX_KEEP, MIN_KEEP, Answer, KeptCall, RefereeLoop, clock_stamp
from optagent.schema import Device
from optagent.settings import REFEREE_FD_ENV

SEED_BITS = 40
MAX_LINE = 256  # no question is longer; a longer one is not the harness's
ONE_SET = 1  # input sets of a refereed loop (above): the CPU's TimingSpec (evaluation/evaluator.py)
QUESTION = {
    "B": re.compile(r"B (\S{1,64}) (baseline|eager) (\d{1,2}) (\d{1,3})"),
    "W": re.compile(r"W (\d{1,2})"),
    "R": re.compile(r"R (\d{1,7}) (\d{1,2}) ([0-9a-f]{64})"),
    "E": re.compile(r"E"),
    "T": re.compile(r"T"),
    "D": re.compile(r"D"),
}
MARKS = ("T", "D")  # a timed call's brackets: the native clock answers them itself
# How long the clock spins for a call's "D" before it blocks (its wake-up would be in the window): on a GPU, where
# calls of microseconds are timed; a CPU's interpreted calls take hundreds of ms, and its cores are few.
SPIN_S = {Device.CUDA: 0.01, Device.CPU: 0.0}


class Referee:
    """One per candidate (or baseline) process: its pipes, a thread answering them, and the log."""

    def __init__(self, spin_s: float = 0.0) -> None:
        self.spin_s = spin_s  # SPIN_S, for the native clock
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
            self._relay = threading.Thread(target=clock, args=(self._q_r, self._a_w, stamped_w, answer_r, self.spin_s),
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
                    window_us, told = (heard - answered) * 1e6, None
                    if self._relay is not None:  # "<window us>[:<seed>:<keep>:<drop>] <question>": the clock's stamp
                        stamp, _, line = line.partition(b" ")
                        window_us, told = clock_stamp(stamp)
                    answer = self._answer(line, window_us, told)
                    if answer is None:
                        return  # a violation: no more answers; the worker's next question finds the pipe closed
                    if self._relay is None or (line not in (b"T", b"D") and told is None):  # the clock answered those
                        answered = time.perf_counter()  # before the answer: the worker it wakes may take our core
                        os.write(self._a_w, answer.encode() + b"\n")
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

    def _answer(self, raw: bytes, window_us: float, told: Optional[Answer] = None) -> Optional[str]:
        """The answer to one question, or None on a violation; `told`: the clock's own answer to an R or a W."""
        text = raw.decode("ascii", errors="replace")
        kind = text[:1]
        m = QUESTION[kind].fullmatch(text) if kind in QUESTION else None
        if m is None or (told is not None and kind not in "RW"):
            self._violate(f"the referee was asked something the harness never asks ({text[:40]!r})")
            return None
        if told is not None and told.seed >> SEED_BITS:
            self._violate("the referee's clock drew a seed out of range")
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
        if kind in ("E", "W") and open_loop.expect != "T":
            self._violate("a timed call left open (its D or its R not said)")
            return None
        if kind == "E":
            open_loop.closed = True
            return "G"
        if kind == "W":
            open_loop.digest_us = None  # warm-up calls in between: the next gap is not one call's to the next
        if kind in MARKS or kind == "R":
            why = self._in_turn(open_loop, kind, window_us)
            if why:
                self._violate(why)
                return None
            if kind in MARKS:
                return "G"
        k = int(m.group(2) if kind == "R" else m.group(1))
        if not 0 <= k < open_loop.n_sets:
            self._violate(f"a timed call on input set {k}, which the harness does not have")
            return None
        keep, drop = False, -1
        if kind == "W" and told is not None:  # the clock's warm-up seed
            if told.keep or told.drop >= 0:
                self._violate("the referee's clock kept a warm-up call")
                return None
            seeds[k] = told.seed
            return f"S {told.seed} 0 -1"
        if kind == "R":
            call = int(m.group(1))
            if call != len(open_loop.calls_us) - 1:
                self._violate(f"timed call {call} reported out of order")
                return None
            entry = KeptCall(call, k, seeds[k], m.group(3))
            if told is not None:
                why = self._file(open_loop, entry, told)
                if why:
                    self._violate(why)
                    return None
                seeds[k] = told.seed
                return f"S {told.seed} {int(told.keep)} {told.drop}"
            if not open_loop.baseline:
                keep, drop = self._reservoir(open_loop, entry)
        seed = self._rng.getrandbits(SEED_BITS)
        seeds[k] = seed
        return f"S {seed} {int(keep)} {drop}"

    @staticmethod
    def _in_turn(lp: RefereeLoop, kind: str, window_us: float) -> Optional[str]:
        """A timed call's T, D and R in their order, each window filed; why one came out of turn, or None."""
        if kind != lp.expect:
            return f"a timed call's {kind} where the harness says {lp.expect}: the call was not bracketed by its timer"
        if kind == "T" and lp.digest_us is not None:  # the time between the last call and this one
            lp.between_us.append(lp.digest_us + window_us)
        elif kind == "D":
            lp.calls_us.append(window_us)
        elif kind == "R":
            lp.digest_us = window_us
        lp.expect = {"T": "D", "D": "R", "R": "T"}[kind]
        return None

    @staticmethod
    def _file(lp: RefereeLoop, entry: KeptCall, told: Answer) -> Optional[str]:
        """The clock's answer to an R filed as _reservoir would have filed it; why it could not be, or None."""
        if lp.baseline and (told.keep or told.drop >= 0):
            return "the referee's clock kept a call of a baseline loop"
        if not lp.baseline:
            lp.seen += 1
        if told.drop >= 0:
            if told.drop not in lp.kept:
                return f"the referee's clock let go of call {told.drop}, which it never kept"
            del lp.kept[told.drop]
        if told.keep:
            lp.kept[entry.call] = entry
        if len(lp.kept) > lp.keep_target:
            return "the referee's clock kept more calls than its loop keeps"
        return None

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
