"""Nsight Compute's ``--csv --page raw`` output, read by the trusted parent.

The file was written inside the profile process's sandbox, where the candidate could have
rewritten it: everything here is parsed defensively. The size is bounded, rows that do not
fit the header are dropped, a number that is not one (or a percentage outside 0-100) is no
reading, and kernel names are cut to printable text. Whatever goes wrong is a CsvError,
which the profiler turns into a profile status, never a crash.

Layout (ncu 2023 and later): ``==PROF==`` lines, then a header row ("ID", "Process ID",
"Process Name", "Host Name", "Kernel Name", ..., one column per metric), a row of units,
and one row per kernel launch, every cell quoted.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from typing import Optional

from optagent.profile_facts import Bound, CaseProfile, ProfiledKernel, ProfileStatus, Stall

MAX_BYTES = 4 << 20  # far above a run's few cases times a few kernels
MAX_ROWS = 20000
NAME_CHARS = 100
KERNELS_KEPT = 4
TOP_STALLS = 3
BUSY_PCT = 60.0  # speed of light: a unit above this share of its peak bounds the kernel

DURATION = "gpu__time_duration.sum"
DRAM = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"  # the speed-of-light section's, on Hopper
DRAM_OTHER = "dram__throughput.avg.pct_of_peak_sustained_elapsed"  # its name on other chips, read where found
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
PERCENTS = (DRAM, DRAM_OTHER, SM, OCCUPANCY)
# Warp-state stalls: the average warps stalled for each reason per issued instruction (WarpStateStats).
STALL = re.compile(r"^smsp__average_warps_issue_stalled_([a-z0-9_]+?)_per_issue_active\.ratio$")
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss", "lg_throttle",
                 "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
                 "not_selected", "short_scoreboard", "sleeping", "tex_throttle", "wait")  # "selected" issues
# Only names an H200's ncu was seen to report (a name it does not know fails the whole profile).
METRICS = (DURATION, DRAM, SM, OCCUPANCY,
           *(f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS))
MARKER = re.compile(r"\bspin_kernel\b")  # worker/profile.py's marker: torch.cuda._sleep
TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


class CsvError(ValueError):
    """ncu's output is not what ncu writes; the message is one line."""


@dataclass
class Launch:
    """One profiled kernel launch: its name and the metrics that parsed (durations in us)."""

    name: str
    values: dict[str, float] = field(default_factory=dict)

    @property
    def is_marker(self) -> bool:
        return bool(MARKER.search(self.name))


def _number(text: str) -> Optional[float]:
    try:
        x = float(text.replace(",", "").strip())
    except ValueError:
        return None
    return x if math.isfinite(x) and x >= 0 else None


def _clean(text: str, limit: int = NAME_CHARS) -> str:
    return _UNPRINTABLE.sub("?", text.strip())[:limit] or "?"


def short_name(name: str) -> str:
    """A kernel's function name without its namespaces, template arguments and parameters: ncu prints
    C++ kernels demangled whole ('void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)')."""
    bare = re.sub(r"^void\s+", "", name.strip()).replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    return _clean(re.split(r"[<(]", bare, maxsplit=1)[0].rsplit("::", 1)[-1].strip() or bare)


def parse(text: str) -> list[Launch]:
    """Every kernel launch in ncu's raw CSV, in launch order; [] when ncu profiled none."""
    if len(text) > MAX_BYTES:
        raise CsvError(f"ncu's output is over {MAX_BYTES >> 20} MiB")
    rows = [r for r in csv.reader(io.StringIO(text.replace("\0", ""))) if r]
    at = next((i for i, r in enumerate(rows) if r[0] == "ID" and "Kernel Name" in r), None)
    if at is None:
        if any(r[0] == "ID" for r in rows):
            raise CsvError("ncu's CSV header is garbled (no Kernel Name column)")
        return []
    header = rows[at]
    if len(set(header)) != len(header):
        raise CsvError("ncu's CSV header names a column twice")
    units = rows[at + 1] if at + 1 < len(rows) and len(rows[at + 1]) == len(header) else None
    if units is None or units[0] != "":
        raise CsvError("ncu's CSV has no units row under its header")
    name_col = header.index("Kernel Name")
    launches: list[tuple[int, Launch]] = []
    for row in rows[at + 2:]:
        if len(row) != len(header) or not row[0].strip().isdigit():
            continue  # ncu's own messages, or a line cut or forged
        if len(launches) >= MAX_ROWS:
            raise CsvError(f"ncu's CSV has over {MAX_ROWS} kernel rows")
        launch = Launch(short_name(row[name_col]))
        for col, (metric, unit) in enumerate(zip(header, units)):
            if metric in (DURATION, *PERCENTS) or STALL.match(metric):
                x = _number(row[col])
                if x is None:
                    continue
                if metric == DURATION:
                    scale = TO_US.get(unit.strip())
                    if scale is None:
                        continue
                    x *= scale
                elif metric in PERCENTS and x > 100.0:
                    continue  # a share of a peak over 100%: not ncu's
                launch.values[metric] = x
        launches.append((int(row[0]), launch))
    return [launch for _, launch in sorted(launches, key=lambda t: t[0])]


def split_cases(launches: list[Launch]) -> list[list[Launch]]:
    """The launches after each marker, one group per profiled case (the markers left out)."""
    groups: list[list[Launch]] = []
    for launch in launches:
        if launch.is_marker:
            groups.append([])
        elif groups:
            groups[-1].append(launch)
    return groups


def _weighted(launches: list[Launch], metric: str) -> Optional[float]:
    """The metric over the case's kernels, each weighed by its duration (1 where ncu gave none)."""
    pairs = [(launch.values.get(DURATION) or 1.0, launch.values[metric]) for launch in launches
             if metric in launch.values]
    total = sum(w for w, _ in pairs)
    return sum(w * x for w, x in pairs) / total if total else None


def _stalls(launches: list[Launch]) -> list[Stall]:
    weight: dict[str, float] = {}
    for launch in launches:
        w = launch.values.get(DURATION) or 1.0
        for metric, x in launch.values.items():
            m = STALL.match(metric)
            if m and m.group(1) in STALL_REASONS:
                weight[m.group(1)] = weight.get(m.group(1), 0.0) + w * x
    total = sum(weight.values())
    if not total:
        return []
    top = sorted(weight.items(), key=lambda kv: -kv[1])[:TOP_STALLS]
    return [Stall(reason=r, share=min(1.0, x / total)) for r, x in top if x > 0]


def bound(dram_pct: Optional[float], sm_pct: Optional[float]) -> Optional[Bound]:
    if dram_pct is None and sm_pct is None:
        return None
    dram, sm = dram_pct or 0.0, sm_pct or 0.0
    if max(dram, sm) < BUSY_PCT:
        return Bound.LATENCY
    return Bound.MEMORY if dram >= sm else Bound.COMPUTE


def summarise(launches: list[Launch], floor_us: Optional[float] = None) -> CaseProfile:
    """One case's profile from its launches; FAILED when it has none."""
    if not launches:
        return CaseProfile(status=ProfileStatus.FAILED, reason="ncu profiled no kernel of this case")
    per_name: dict[str, float] = {}
    for launch in launches:
        per_name[launch.name] = per_name.get(launch.name, 0.0) + (launch.values.get(DURATION) or 0.0)
    durations = [launch.values[DURATION] for launch in launches if DURATION in launch.values]
    total = sum(durations) if durations else None
    dram, sm = _weighted(launches, DRAM), _weighted(launches, SM)
    dram = dram if dram is not None else _weighted(launches, DRAM_OTHER)
    kernels = [ProfiledKernel(name=n, duration_us=d if durations else None)
               for n, d in sorted(per_name.items(), key=lambda kv: -kv[1])[:KERNELS_KEPT]]
    return CaseProfile(status=ProfileStatus.PROFILED, kernels=kernels, kernel_count=len(launches),
                       duration_us=total, dram_pct=dram, sm_pct=sm, occupancy_pct=_weighted(launches, OCCUPANCY),
                       stalls=_stalls(launches), bound=bound(dram, sm),
                       floor_pct=100.0 * floor_us / total if floor_us and total else None)


# ncu's own messages that mean the counters cannot be read on this machine, whatever the kernel.
NO_COUNTERS = re.compile(r"ERR_NVGPUCTRPERM|Failed to initialize the profiler|[Pp]rofiling is not supported|"
                         r"[Dd]evice not supported|not have permission to access NVIDIA GPU Performance Counters")


def diagnose(text: str) -> Optional[tuple[ProfileStatus, str]]:
    """What ncu's ``==ERROR==`` lines say went wrong, if anything: (status, its first such line)."""
    errors = [line.strip() for line in text.splitlines() if "==ERROR==" in line]
    if not errors:
        return None
    counters = next((e for e in errors if NO_COUNTERS.search(e)), None)
    if counters:
        return ProfileStatus.NO_COUNTERS, _clean(counters.replace("==ERROR==", ""), 300)
    return ProfileStatus.FAILED, "ncu: " + _clean(errors[0].replace("==ERROR==", ""), 300)
