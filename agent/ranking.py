"""Whether a bench's timings rank kernels: the one policy that the accept rule, the parent rule, the
planner's prompts, the run's summary lines and the reports consult.

On a GPU a kernel's time ranks it against another timed beside it. Under Triton's CPU interpreter (or any
CPU timing) the figures are labels: they say the kernel ran and passed, never that it is faster, so on
such a bench the first passing kernel stays the best and no timing replaces it (search/accept.py).
"""

from __future__ import annotations

from typing import Iterable, Optional

from optagent.schema import Device, EvalResult


def timings_rank(device: Optional[Device] = None, results: Iterable[Optional[EvalResult]] = ()) -> bool:
    """False when the bench is the CPU (a run's device) or any of the results was timed there."""
    return device is not Device.CPU and not any(r is not None and r.on_cpu for r in results)
