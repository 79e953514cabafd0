"""A saved sample's file: the outputs the judge checks, written by the harness and read back by the judge.

Raw bytes behind a small JSON header, digested by a tree of sha256s computed on several threads. It
replaces torch.save into memory, a copy of those bytes to the file and one sha256 over them on one core
(and, in the judge, a read into memory, the same sha256 and torch.load from that copy): for a package with
large outputs (a 4096 x 8192 bf16 add + RMSNorm writes 128 MiB a call, five or six samples a case) those
took 5 s of a candidate's process and 5 s of its judge on the H200 (bench/eval_profile.py). Now:

- the harness copies a GPU output into a pinned staging buffer kept by the process (a pageable copy of a
  fresh tensor ran under 1 GB/s there), writes it from there and digests it while it writes;
- the judge maps the file (no copy), digests the mapping and makes the tensors from it.

The file is the candidate's: the judge trusts nothing in it. The digest is checked first (the one the
harness reported when it saved the file: a file rewritten since fails), then every field of the header:
the dtypes by name from a fixed list, shapes, and every tensor's extent within the data, or the file is
refused as not the harness's.

    magic (16 bytes) | header length (8 bytes, little-endian) | header JSON | zero padding to ALIGN | data
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import Any, Optional

import torch

MAGIC = b"optagent-sample1"
ALIGN = 64  # each tensor's bytes start at a multiple of this: a view as any dtype lines up
CHUNK = 8 << 20  # bytes digested per thread at a time
MAX_HEADER = 1 << 20
THREADS = max(1, min(8, os.cpu_count() or 1))
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128,
    *(getattr(torch, n) for n in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                  "float8_e5m2fnuz") if hasattr(torch, n)))}
_staging: Optional[torch.Tensor] = None  # pinned host memory, grown as needed (harness side)
STAGING_MAX = 1 << 30  # larger outputs go through pageable memory


class SampleFileError(ValueError):
    """The file is not what the harness saved: `rewritten` when its digest differs from the one reported."""

    def __init__(self, why: str, rewritten: bool = False):
        super().__init__(why)
        self.rewritten = rewritten


def _pad(n: int) -> int:
    return -n % ALIGN


def digest(head: memoryview, data: memoryview) -> str:
    """sha256 over the sha256s of the header part and of each CHUNK of the data, in order, the chunks hashed
    on THREADS threads (hashlib lets go of the interpreter's lock over large buffers). Threads a call starts
    and joins: a candidate's process may keep none running (worker/candidate.py counts them)."""
    spans = [(s, min(s + CHUNK, len(data))) for s in range(0, len(data), CHUNK)]
    sums: list[bytes] = [b""] * len(spans)
    n = min(THREADS, len(spans))

    def work(k: int) -> None:
        for j in range(k, len(spans), n):
            a, b = spans[j]
            sums[j] = hashlib.sha256(data[a:b]).digest()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, n)]
    for t in threads:
        t.start()
    if spans:
        work(0)
    for t in threads:
        t.join()
    top = hashlib.sha256(MAGIC)
    top.update(hashlib.sha256(head).digest())
    for s in sums:
        top.update(s)
    return top.hexdigest()


def _host_bytes(tensors: list[torch.Tensor]) -> tuple[memoryview, list[int]]:
    """Every tensor's bytes, contiguous, each at an ALIGNed offset of one host buffer: (the buffer, offsets)."""
    global _staging
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        n = t.numel() * t.element_size()
        total += n + _pad(n)
    on_gpu = any(t.device.type == "cuda" for t in tensors)
    if on_gpu and total <= STAGING_MAX:
        if _staging is None or _staging.numel() < total:
            _staging = None
            _staging = torch.empty(max(total, 1 << 20), dtype=torch.uint8, pin_memory=True)
        buf = _staging[:total]
    else:
        buf = torch.empty(total, dtype=torch.uint8)
    for t, off in zip(tensors, offsets):
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
        buf[off:off + raw.numel()].copy_(raw, non_blocking=on_gpu)
    if on_gpu:
        torch.cuda.synchronize()
    return memoryview(buf.numpy()), offsets


def write(path: Path, outputs: dict[int, torch.Tensor], inputs: Optional[dict[int, str]] = None,
          extra: Optional[dict] = None) -> str:
    """Save the outputs (argument index -> tensor) and, for a checked run, its inputs' checksums; the digest.
    `extra`: what else the reader gets back as it was (JSON), under "extra" (worker/case_store.py's)."""
    order = sorted(outputs)
    data, offsets = _host_bytes([outputs[i] for i in order])
    header = {"tensors": [{"index": i, "dtype": str(outputs[i].dtype).removeprefix("torch."),
                           "shape": list(outputs[i].shape), "offset": off, "cpu": outputs[i].device.type == "cpu",
                           "nbytes": outputs[i].numel() * outputs[i].element_size()}
                          for i, off in zip(order, offsets)],
              "inputs": {str(k): v for k, v in inputs.items()} if inputs is not None else None, "extra": extra}
    text = json.dumps(header).encode()
    head = MAGIC + struct.pack("<Q", len(text)) + text
    head += b"\0" * _pad(len(head))
    result: list[str] = []
    hasher = threading.Thread(target=lambda: result.append(digest(memoryview(head), data)))
    hasher.start()  # digested while written: both only read the buffer
    try:
        with open(path, "wb") as f:
            f.write(head)
            f.write(data)
    finally:
        hasher.join()
    return result[0]


def read(fd: int, device: str, expected: Optional[str]) -> dict[Any, Any]:
    """The saved outputs {index: tensor on `device`} and "inputs" (the checksums, or None), from a file the
    parent opened; SampleFileError when its digest is not `expected` or it is not as the harness writes.
    expected None: a file only trusted code wrote (worker/case_store.py), not digested; a tensor that was
    on the host when written ("cpu") comes back there, in a sample as in a stored case."""
    size = os.fstat(fd).st_size
    if size < len(MAGIC) + 8:
        raise SampleFileError("shorter than any the harness writes")
    try:
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)  # private: the tensors made from it may be written
    except (OSError, ValueError) as e:
        raise SampleFileError(f"it cannot be mapped ({e})") from None
    view = memoryview(mm)
    if bytes(view[:len(MAGIC)]) != MAGIC:
        raise SampleFileError("not a file the harness writes")
    (n,) = struct.unpack("<Q", view[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8 + n
    if n > MAX_HEADER or start > size:
        raise SampleFileError("its header runs past the file")
    start += _pad(start)
    if expected is not None and digest(view[:start], view[start:]) != expected:
        raise SampleFileError("rewritten after the harness saved it", rewritten=True)
    try:
        header = json.loads(bytes(view[len(MAGIC) + 8:len(MAGIC) + 8 + n]))
        out: dict[Any, Any] = {}
        for entry in header["tensors"]:
            index, shape, off, nbytes = int(entry["index"]), [int(s) for s in entry["shape"]], \
                int(entry["offset"]), int(entry["nbytes"])
            dtype = DTYPES[entry["dtype"]]
            numel = 1
            for s in shape:
                if s < 0:
                    raise ValueError("a negative size")
                numel *= s
            item = torch.empty((), dtype=dtype).element_size()
            if nbytes != numel * item or off < 0 or off % ALIGN or start + off + nbytes > size or index in out:
                raise ValueError(f"tensor {index}'s bytes are not where its header says")
            flat = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=start + off) if nbytes \
                else torch.empty(0, dtype=torch.uint8)
            out[index] = flat.view(dtype).reshape(shape).to("cpu" if entry.get("cpu") is True else device)
        inputs = header["inputs"]
        out["inputs"] = None if inputs is None else {int(k): str(v) for k, v in dict(inputs).items()}
        out["extra"] = header.get("extra")
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise SampleFileError(f"its header is not the harness's ({e})") from None
    return out
