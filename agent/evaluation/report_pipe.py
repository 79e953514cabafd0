"""The parent's end of the native timer's pipes: the secret it hands over, the records it reads.

Two pipes per candidate process. The first holds 32 random bytes: the parent writes them and
closes its end, the child's timer reads them once at init and closes its end. The second
carries the timer's records; a thread blocks on it and stamps each line with the parent's
own monotonic clock as it arrives, so the wall-clock bound does not depend on how busy the
parent's main loop is.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from typing import Optional

SECRET_BYTES = 32
JOIN_S = 5.0


class ReportPipe:
    def __init__(self) -> None:
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self.secret_r, secret_w = os.pipe()
        os.write(secret_w, self.secret)  # 32 bytes fit any pipe buffer: the write never blocks
        os.close(secret_w)
        self.report_r, self.report_w = os.pipe()
        self.lines: list[tuple[float, bytes]] = []
        self._thread: Optional[threading.Thread] = None

    @property
    def child_fds(self) -> tuple[int, int]:
        """(secret_fd, report_fd), as the child gets them (argv and pass_fds)."""
        return self.secret_r, self.report_w

    def started(self) -> None:
        """The child holds its ends now: close ours, and start reading."""
        os.close(self.secret_r)
        os.close(self.report_w)
        self._thread = threading.Thread(target=self._read, name="optagent-timer-report", daemon=True)
        self._thread.start()

    def abandon(self) -> None:
        """The child never started."""
        for fd in (self.secret_r, self.report_w, self.report_r):
            try:
                os.close(fd)
            except OSError:
                pass

    def _read(self) -> None:
        pending = b""
        while True:
            try:
                data = os.read(self.report_r, 1 << 16)
            except OSError:
                break
            at = time.monotonic()
            if not data:
                break
            *done, pending = (pending + data).split(b"\n")
            self.lines.extend((at, line) for line in done)
            if len(pending) > 1 << 20:  # no record is this long
                self.lines.append((at, pending))
                pending = b""
        if pending:
            self.lines.append((time.monotonic(), pending))

    def finish(self) -> list[tuple[float, bytes]]:
        """The lines read, once every writer has gone (the worker's group is dead by now)."""
        if self._thread is not None:
            self._thread.join(JOIN_S)
        try:
            os.close(self.report_r)
        except OSError:
            pass
        return list(self.lines)
