"""A timing lane's health check: ``python -m optagent.worker.health DEVICE``, exit 0 when the device works.

A fresh process, so a context that a candidate process poisoned is not what is tested, but the device
itself: one small computation on it, checked and synchronised. Trusted code only (no candidate here),
run by a cluster's lane actor (evaluation/ray_lane.py) when it starts and after a result that names a
device fault. Imports torch: never imported by the orchestrator.
"""

from __future__ import annotations

import sys

N = 4096


def check(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible to this process")
    x = torch.arange(N, dtype=torch.float32, device=device)
    got = float((x * 2 + 1).sum().item())  # .item() synchronises: a sticky CUDA error surfaces here
    want = float(N * (N - 1) + N)
    if got != want:
        raise RuntimeError(f"a sum on {device} came out {got}, not {want}")
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    try:
        check(device)
    except Exception as e:  # one line on stderr: the actor's reason for replacing itself
        print(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
