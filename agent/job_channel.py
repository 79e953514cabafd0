"""A job sent to a worker that was started before it was known (evaluation/warm_worker.py), on a Unix socket.

The parent sends the descriptors the job names (the judge's saved outputs, opened by the parent) with
SCM_RIGHTS, a chunk at a time, each chunk with a single zero byte; then one line, the JSON list of the
numbers those descriptors have in the parent, in the order sent; then the job's JSON; then it shuts the
socket. The worker reads to the end: the descriptors arrive in the order sent, so the n-th received is the
n-th number of the list, and the job's numbers are mapped to its own (worker/__main__.py).
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
    sock.sendall(json.dumps(fds).encode() + b"\n" + job)
    sock.shutdown(socket.SHUT_WR)


def receive(fd: int) -> tuple[bytes, dict[int, int]]:
    """The job's bytes, and each parent descriptor number -> the worker's descriptor of the same file."""
    sock = socket.socket(fileno=fd)
    data, got = bytearray(), []
    try:
        while True:
            chunk, fds, _, _ = socket.recv_fds(sock, 1 << 16, FDS_PER_MESSAGE)
            got.extend(fds)
            if len(got) > MAX_FDS:
                raise ValueError("the job's socket carried too many descriptors")
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    head, _, job = bytes(data).lstrip(b"\0").partition(b"\n")
    numbers = json.loads(head)
    if not isinstance(numbers, list) or len(numbers) != len(got):
        for f in got:
            os.close(f)
        raise ValueError(f"the job's socket carried {len(got)} descriptors for {head[:80]!r}")
    return job, dict(zip(numbers, got))
