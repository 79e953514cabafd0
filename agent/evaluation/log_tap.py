"""A worker's stdout and stderr: drained by a thread of the parent into a log file capped on disk,
only the tail kept in memory; past the cap the output limit (evaluation/limits.py) is broken."""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path
from typing import Union

TAIL_BYTES = 64 << 10  # what the parent keeps of the output in memory


class LogTap:
    """Drains a worker's stdout+stderr into `path`, at most `cap` bytes on disk, the tail in memory."""

    def __init__(self, fd: int, path: Union[Path, int], cap: int):
        """path: the log file, or a descriptor the caller opened safely for it (evaluation/safe_files.py)."""
        self.fd, self.cap, self.total = fd, cap, 0
        self.file = open(path, "wb")
        self.tail = bytearray()
        self.over = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="optagent-log", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if not ready:
                continue
            data = os.read(self.fd, 1 << 16)
            if not data:
                return
            room = self.cap - self.total
            if room > 0:
                self.file.write(data[:room])
            self.total += len(data)
            if self.total > self.cap and not self.over.is_set():
                self.file.write(f"\n[optagent: output over {self.cap >> 20} MiB was cut here]\n".encode())
                self.over.set()
            self.tail += data[-TAIL_BYTES:]
            del self.tail[:-TAIL_BYTES]

    def tail_now(self) -> str:
        """The tail so far, the log still drained (a judge that answered: sandbox._reap closes it later)."""
        return bytes(self.tail).decode(errors="replace")

    def close(self, wait_s: float = 5.0) -> str:
        """Stops draining once the writers are gone (or after wait_s); returns the tail."""
        self._thread.join(wait_s)
        self._stop.set()
        self._thread.join(1.0)
        if not self._thread.is_alive():
            os.close(self.fd)
            self.file.close()
        return self.tail.decode(errors="replace")
