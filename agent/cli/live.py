"""What a step is doing right now, on stderr: a live status line on a terminal, plain lines elsewhere.

On a terminal a rich live line (spinner, phase, elapsed time) follows every
Progress event and is erased before the step's own line is printed. In a log
or CI, where a live line would be noise, a plain line is printed when a step
enters a new stage (proposing, starting, baseline, compiling, cases, judging,
a re-time) and every HEARTBEAT_S while one lasts, so no step is silent for long.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from optagent.progress import Phase, Progress, describe

HEARTBEAT_S = 20.0

# Cases run and are timed in turn: in plain lines that is one stage, told once and then by heartbeats.
STAGE = {Phase.TIMING: Phase.CASE}


class LiveProgress:
    """A ProgressSink that shows the latest event; pause() before printing anything else."""

    def __init__(self, con: Console, live: Optional[bool] = None, heartbeat_s: float = HEARTBEAT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.con, self.heartbeat_s, self.clock = con, heartbeat_s, clock
        self.live = con.is_terminal if live is None else live
        self.event: Optional[Progress] = None
        self.step_t0 = self.phase_t0 = self.said_t = 0.0
        self.stage: Optional[tuple] = None
        self._lock = threading.RLock()
        self._display: Optional[Live] = None
        self._spinner = Spinner("dots")
        self._stop = threading.Event()
        self._ticker: Optional[threading.Thread] = None

    def __call__(self, event: Progress) -> None:
        with self._lock:
            now, last = self.clock(), self.event
            if last is None or event.step != last.step:
                self.step_t0 = now
            if last is None or (event.phase, event.subject, event.case) != (last.phase, last.subject, last.case):
                self.phase_t0 = now
            self.event = event
            if self.live:
                if self._display is None:
                    self._display = Live(self, console=self.con, transient=True, refresh_per_second=4,
                                         redirect_stdout=False)  # stdout may be a file: leave it be
                    self._display.start()
                return
            stage = (event.step, event.subject, STAGE.get(event.phase, event.phase))
            if stage != self.stage:
                self.stage = stage
                self._say(now)
        if self._ticker is None and not self.live and self.heartbeat_s > 0:
            self._ticker = threading.Thread(target=self._tick, name="optagent-progress", daemon=True)
            self._ticker.start()

    def text(self) -> str:
        event, now = self.event, self.clock()  # read once: the live display renders from its own thread
        return describe(event, now - self.step_t0, now - self.phase_t0) if event else ""

    def __rich__(self) -> Table:
        grid = Table.grid(padding=(0, 1))
        grid.add_row(self._spinner, Text(self.text(), style="dim"))
        return grid

    def _say(self, now: float) -> None:
        self.said_t = now
        self.con.print(f"  ... {self.text()}", markup=False, highlight=False, soft_wrap=True)

    def _tick(self) -> None:
        while not self._stop.wait(min(1.0, self.heartbeat_s / 4)):
            with self._lock:
                now = self.clock()
                if self.event is not None and not self.live and now - self.said_t >= self.heartbeat_s:
                    self._say(now)

    def pause(self) -> None:
        """Take the status line away (until the next event), so other output prints cleanly."""
        with self._lock:
            if self._display is not None:
                self._display.stop()
                self._display = None
            self.event, self.stage = None, None

    def close(self) -> None:
        self.pause()
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
