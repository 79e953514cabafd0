"""The bytes a kernel must move, estimated for a package without a bytes_moved hook.

Each tensor counted once however often it is passed: a pure output written whole; an in/out tensor
only where the baseline changes it (a KV cache written at a few slots is not moved whole); a read-only
input read whole, except a large one (a lookup table, a cache) of which only the row groups the
baseline reads count: a group filled with NaN that leaves every output unchanged is not read.
An estimate: never used to reject a time, and labelled as one wherever it is shown.
"""

from __future__ import annotations

import torch

from optagent.worker.arg_roles import ArgRoles, touched
from optagent.worker.args import clone_args, run_baseline

GROUPS = 16  # row groups probed in a large read-only input
LARGE = 4  # a read-only input this many times the written bytes is probed, not counted whole


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _read_part(config, args: list, roles: ArgRoles, i: int, base: list) -> int:
    """The bytes of read-only input i in the row groups whose NaN reaches a written argument."""
    a = args[i]
    rows = a.shape[0]
    groups = min(GROUPS, rows)
    per_row = _nbytes(a) // rows
    read = 0
    for g in range(groups):
        lo, hi = rows * g // groups, rows * (g + 1) // groups
        kept = a[lo:hi].clone()
        a[lo:hi] = float("nan")
        trial = [x.clone() if j in roles.written else x for j, x in enumerate(args)]
        try:
            after = run_baseline(config, trial)
        except Exception:  # noqa: BLE001 (a baseline that refuses NaN: the group counts as read)
            after = None
        a[lo:hi] = kept
        if after is None:
            read += (hi - lo) * per_row
            continue
        if any(bool((torch.isnan(after[j]) & ~torch.isnan(base[j])).any()) for j in roles.written
               if after[j].is_floating_point()):
            read += (hi - lo) * per_row
    return read


def estimated_bytes(config, args: list, roles: ArgRoles) -> int:
    base = run_baseline(config, clone_args(args))
    written = 0
    for i in roles.written:
        written += _nbytes(args[i]) if i in roles.outputs else int(touched(args[i], base[i]).sum()) * args[i].element_size()
    floats_written = any(args[j].is_floating_point() for j in roles.written)
    seen: dict[int, int] = {}
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) or i in roles.written:
            continue
        key = a.data_ptr() if a.numel() else id(a)
        large = a.is_floating_point() and a.dim() >= 1 and a.shape[0] > 1 and _nbytes(a) > LARGE * max(written, 1)
        seen[key] = _read_part(config, args, roles, i, base) if large and floats_written else _nbytes(a)
    return written + sum(seen.values())
