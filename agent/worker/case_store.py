"""Cases whose generation is slow, generated once and kept in the cache for every later process (child side).

A contest package's genTestCase often draws on the host with a CPU generator and moves the tensors to the
device (torch.randn(..., generator=g).to(device)): about 0.25 s for a 32M-element tensor. Every process
drew each case again: the candidate's, each judge's and a re-time's, 2-2.5 s each for an add + RMSNorm
package on the H200 (bench/eval_profile.py). A case that took over SLOW_S to generate is written here by a
trusted process (a judge or the lane's baseline job: only they may write the cache, worker_command.py) in
worker/sample_file.py's format, and read back by any process of the same package, torch and device; the
candidate and its judge then hold the same bits by construction, whatever the generator does.

Only where the parent says the cache is the trusted workers' alone (Job.stored_cases: bubblewrap, Landlock),
and only a case whose arguments it can give back as they were: contiguous tensors that share no memory,
each on the device or the host it was made on, and plain numbers or strings beside them.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from optagent.cache import cache_root
from optagent.task import TaskPackage
from optagent.worker import sample_file

SLOW_S = 0.05  # seconds to generate, past which a case is kept (harness.py's SLOW_GENERATION_S)
MAX_CASE = 1 << 30  # bytes of tensors a case, at most
MAX_BYTES = 8 << 30  # the store's size; the least recently used go first
PLAIN = (int, float, bool, str, type(None))


def root() -> Path:
    return cache_root() / "cases"


class CaseStore:
    def __init__(self, task: TaskPackage, device: str, write: bool):
        """The store of `task`'s cases (keyed by its files' digest, torch's version and the device); `write`: a
        trusted worker, which keeps what it drew slowly."""
        self.prefix = hashlib.sha256(f"{task.digest()}|{torch.__version__}|{device}".encode()).hexdigest()[:24]
        self.device, self.write = device, write

    def path(self, key: tuple) -> Path:
        return root() / f"{self.prefix}-{hashlib.sha256(repr(key).encode()).hexdigest()[:24]}.case"

    def load(self, key: tuple) -> Optional[tuple[list, bool]]:
        """The case's arguments and whether they were made at its shrunk sizes, or None: not kept."""
        try:
            fd = os.open(self.path(key), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            saved = sample_file.read(fd, self.device, None)
            extra = saved["extra"]
            args: list[Any] = list(extra["args"])
            for i in range(len(args)):
                if i in saved:
                    args[i] = saved[i]
            try:
                os.utime(fd)  # the newest: trimmed last (a process that may not write the cache reads it all the same)
            except OSError:
                pass
            return args, bool(extra["small"])
        except (sample_file.SampleFileError, KeyError, TypeError, OSError):
            return None  # a file of an older format: generated again (and not written over)
        finally:
            os.close(fd)

    def save(self, key: tuple, args: list, small: bool) -> None:
        if not self.write or not keepable(args):
            return
        path = self.path(key)
        tmp: Optional[Path] = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # a temp name of its own (not the pid: judges in PID namespaces share theirs), renamed into place
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
            tmp = Path(name)
            tensors = {i: a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
            sample_file.write(tmp, tensors, extra={"args": [None if i in tensors else a for i, a in enumerate(args)],
                                                   "small": small})
            os.replace(tmp, path)  # whole or not at all: two judges may write the same case
            _trim()
        except OSError:
            pass  # a store that cannot be written costs the next process its generation, nothing more
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)


def keepable(args: list) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    spans = sorted((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), t.device.type) for t in tensors)
    shared = any(a[2] == b[2] and b[0] < a[0] + a[1] for a, b in zip(spans, spans[1:]))
    return (all(isinstance(a, (torch.Tensor, *PLAIN)) for a in args) and not shared
            and all(t.is_contiguous() and not t.requires_grad and t.storage_offset() == 0
                    and t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in tensors)
            and sum(t.numel() * t.element_size() for t in tensors) <= MAX_CASE)


def _trim() -> None:
    files = sorted((p.stat().st_mtime, p.stat().st_size, p) for p in root().glob("*.case"))
    total = sum(size for _, size, _ in files)
    for _, size, p in files:
        if total <= MAX_BYTES:
            break
        p.unlink(missing_ok=True)
        total -= size
