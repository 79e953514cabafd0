"""What % of the bandwidth floor is reachable at all, under our timing method, per decode case.

The decode kernels' GPU times fit t = bytes / 3.87 TB/s + ~14 us on an H200 (session 2),
so small cases sit far under the floor. This separates the method's own costs from the
kernels': per case it times, with the L2 flushed by a write (``zero_``, as the evaluator
and issue 5's anchors do) and by a read, an empty launch and a plain streaming read of
exactly the case's K+V bytes. A benchmark, not a test.

    python3 bench/floor_probe.py
"""

from __future__ import annotations

import torch

from decode_table import ANCHOR_GBS, CASES, D, H, event_median, flusher  # same cases, floor and timing


def main() -> None:
    big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    sink = torch.empty((), dtype=torch.int64, device="cuda")
    flushes = {"zero_ flush": flusher(big, "zero"), "read flush": flusher(big, "read")}
    tiny = torch.zeros(1, device="cuda")
    print(f"{'bs/seqlen':<10}{'floor us':>9}" + "".join(f"{f + ': empty / read us / % floor':>40}" for f in flushes))
    for bs, s in CASES:
        n = 2 * bs * s * H * D * 2  # K and V bytes of the case
        data = torch.randint(0, 1 << 30, (n // 8,), dtype=torch.int64, device="cuda")
        floor = n / (ANCHOR_GBS * 1e3)
        row = f"{bs}/{s // 1024}k".ljust(10) + f"{floor:9.1f}"
        for flush in flushes.values():
            empty = event_median(lambda: tiny.add_(1), flush, reps=30)
            read = event_median(lambda: torch.sum(data, dim=0, out=sink), flush, reps=30)
            row += f"{empty:14.1f} /{read:10.1f} /{100 * floor / read:8.0f}%   "
        print(row)


if __name__ == "__main__":
    main()
