"""A job sent to a worker that was started before it was known (evaluation/warm_worker.py), on a Unix socket.

The parent sends the descriptors the job names (the judge's saved outputs, opened by the parent) with
SCM_RIGHTS, a chunk at a time, each chunk with a single zero byte; then one line, a JSON object with the
numbers those descriptors have in the parent, in the order sent, and the length of the job's JSON; then the
job's JSON. The worker reads one such frame: the descriptors arrive in the order sent, so the n-th received is
the n-th number of the list, and the job's numbers are mapped to its own (worker/__main__.py). A judge that
serves one evaluation after another (evaluation/judges.py JudgeService) reads the next frame once it has
answered; the socket's end, between frames, is its end.
"""

from __future__ import annotations

import json
import os
import socket

# The one byte a warm worker writes on its socket once its start-up is over (worker/__main__.py warm_up), before
# it reads any job: the parent holds a lane's timed phases until the processes starting on it are warm
# (warm_worker.Spares.settle). Only the harness's code has run when it is written; a later byte, or the socket's
# end, says no more than that the start-up is over.
WARM = b"w"
FDS_PER_MESSAGE = 200  # under the kernel's SCM_MAX_FD (253) per message
MAX_FDS = 4096


def send(sock: socket.socket, job: bytes, fds: list[int]) -> None:
    for k in range(0, len(fds), FDS_PER_MESSAGE):
        socket.send_fds(sock, [b"\0"], fds[k:k + FDS_PER_MESSAGE])
    sock.sendall(json.dumps({"fds": fds, "bytes": len(job)}).encode() + b"\n" + job)


def receive(sock: socket.socket) -> tuple[bytes, dict[int, int]]:
    """One frame: the job's bytes, and each parent descriptor number -> the worker's descriptor of the same file.
    EOFError when the socket ended before a frame began (no more jobs); ValueError for anything else amiss."""
    data, got = bytearray(), []
    head: dict = {}
    try:
        while True:
            if not head and b"\n" in data:
                line, _, rest = bytes(data).lstrip(b"\0").partition(b"\n")
                head, data = _header(line, len(got)), bytearray(rest)
            if head and len(data) >= head["bytes"]:
                break
            chunk, fds, _, _ = socket.recv_fds(sock, 1 << 16, FDS_PER_MESSAGE)
            got.extend(fds)
            if len(got) > MAX_FDS:
                raise ValueError("the job's socket carried too many descriptors")
            if not chunk:
                if not data.strip(b"\0") and not got and not head:
                    raise EOFError("the job's socket ended")
                raise ValueError("the job's socket ended inside a frame")
            data += chunk
        if len(data) != head["bytes"]:
            raise ValueError("the job's socket carried more than its frame")
    except BaseException:
        for f in got:
            os.close(f)
        raise
    return bytes(data), dict(zip(head["fds"], got))


def _header(line: bytes, received: int) -> dict:
    try:
        head = json.loads(line)
        ok = (isinstance(head, dict) and isinstance(head.get("fds"), list) and isinstance(head.get("bytes"), int)
              and all(isinstance(n, int) for n in head["fds"]))
    except ValueError:
        ok = False
    if not ok or len(head["fds"]) != received:
        raise ValueError(f"the job's socket carried {received} descriptors for {line[:80]!r}")
    return head
