"""What the judge compares of tensors it did not watch being made, computed where the tensors live.

``outputs_digest``: a timed call's outputs as they were when the call returned, told to the referee
(worker/after_work.py) and recomputed by the judge over the saved copy (worker/judge.py).
``checksum``: a checked call's inputs after the call, compared with the judge's own rebuild of them.
Both run on the GPU for GPU tensors: no copy to the host, one sync. A digest is told between every
two timed calls and the referee's clock runs meanwhile, so its cost must be small and steady (a GiB
KV cache written in place took most of a second a call through the host's sha256).
"""

from __future__ import annotations

import hashlib
from typing import Callable, Optional

import torch

CHUNK = 1 << 24  # elements per pass (checksum): a multi-GiB KV cache needs no int64 copy of itself
DIGEST_CHUNK = 1 << 22  # words per pass of the digest, whose two lanes hold four int64 copies of a pass


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


# Two lanes of a 64-bit multiply-xorshift mix, each word salted with its position and lane, summed over
# the words: a sum of a non-linear function of every word, so nothing short of the outputs themselves
# gives their digest (a linear checksum of a linear operation's outputs can be computed from its inputs'
# sums alone). int64 arithmetic wraps alike on a CPU and a GPU, in any order. Seven launches a chunk, the
# salts kept for small outputs: the digest sits in the referee's window of every timed call.
_MIX = (_signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB))
_LANES = (_signed(0x9E3779B97F4A7C15), _signed(0xD1B54A32D192ED03))
_LOW32 = (1 << 32) - 1  # a logical right shift from torch's arithmetic one
_SALTS: dict[tuple[int, int, str], torch.Tensor] = {}
# timer.c's digest kernel (native/digest.cu): the same sums in one read of the words, where the formula below takes
# ten passes over twice their size (2 ms a call for 128 MiB of outputs on an H100). The harness's, set by
# worker/timers.py; the judge keeps the formula, so a digest the kernel got wrong fails the candidate, never passes.
_native: Optional[Callable[[int, int], tuple[int, int]]] = None
_KEEP_SALTS = 1 << 20  # words: salts for outputs up to 8 MiB are kept between calls


def _salts(start: int, n: int, device: torch.device) -> torch.Tensor:
    key = (start, n, str(device))
    if key in _SALTS:
        return _SALTS[key]
    pos = torch.arange(start, start + n, device=device, dtype=torch.int64)
    lanes = torch.tensor(_LANES, device=device, dtype=torch.int64)
    salts = pos.unsqueeze(1) * _MIX[1] + lanes
    if n <= _KEEP_SALTS:
        _SALTS[key] = salts
    return salts


def _words(t: torch.Tensor) -> torch.Tensor:
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    if raw.numel() % 8:
        raw = torch.cat([raw, raw.new_zeros(8 - raw.numel() % 8)])
    return raw.view(torch.int64)


def _mixed(words: torch.Tensor, start: int) -> torch.Tensor:
    z = (words.unsqueeze(1) ^ _salts(start, words.numel(), words.device)) * _MIX[0]
    return ((z ^ ((z >> 32) & _LOW32)) * _MIX[1]).sum(0)


def use_native(sums: Optional[Callable[[int, int], tuple[int, int]]]) -> None:
    """sums(device address, words) -> the two sums, for this process's digests of GPU tensors (None: the formula)."""
    global _native
    _native = sums


def _gpu_sums(words: torch.Tensor) -> list[int]:
    """The two sums, unsigned, of an int64 GPU tensor: by the native kernel where it is set, else the formula."""
    global _native
    if (_native is not None and words.data_ptr() % 8 == 0 and words.device.index in (None, torch.cuda.current_device())
            and torch.cuda.current_stream().cuda_stream == 0):  # the kernel runs on the legacy default stream
        try:
            return list(_native(words.data_ptr(), words.numel()))
        except RuntimeError:  # the driver refused the kernel (a GPU before sm_75, an old driver): the formula
            _native = None
    sums = torch.zeros(len(_LANES), dtype=torch.int64, device=words.device)
    for s in range(0, words.numel(), DIGEST_CHUNK):
        sums += _mixed(words[s:s + DIGEST_CHUNK], s)
    return [v % (1 << 64) for v in sums.tolist()]


def outputs_digest(outputs: dict) -> str:
    """64 hex digits over the output tensors (argument order, shapes, dtypes and every byte): a host
    tensor's bytes go through sha256 as they are; a GPU tensor's through the mixed sums above, on the GPU,
    one sync a tensor. The judge computes it of the saved copy on the same device as the harness did."""
    h = hashlib.sha256()
    for i in sorted(outputs):
        t = outputs[i].detach()
        h.update(f"{i}:{tuple(t.shape)}:{t.dtype}:{t.device.type};".encode())
        words = _words(t)
        if t.device.type == "cpu":
            h.update(words.numpy().tobytes())
            continue
        h.update(":".join(str(v) for v in _gpu_sums(words)).encode())
    return h.hexdigest()


def checksum(t: torch.Tensor) -> str:
    """A position-sensitive checksum of a tensor's bytes, computed where the tensor lives.

    The judge compares it with the same checksum of its own rebuild of the inputs: as strong a
    test that the inputs were left unchanged as saving them whole, without copying GiBs to the
    host and to disk. Integer sums wrap the same in any order, so both processes agree exactly.
    """
    b = t.detach().contiguous().view(-1).view(torch.uint8)
    words = b.view(torch.int32) if b.numel() % 4 == 0 else b.to(torch.int32)
    plain = weighted = 0
    for s in range(0, words.numel(), CHUNK):
        c = words[s:s + CHUNK].to(torch.int64)
        pos = torch.arange(s, s + c.numel(), device=c.device, dtype=torch.int64) % 1000003 + 1
        plain += int(c.sum())
        weighted += int((c * pos).sum())
    return f"{tuple(t.shape)}:{t.dtype}:{plain}:{weighted % (1 << 64)}"
