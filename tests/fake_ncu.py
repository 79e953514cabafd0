"""A stand-in for Nsight Compute's ``ncu``, for CPU tests: it runs the program it is given (the profile
worker, inside optagent's sandbox) and then writes what ncu writes with ``--csv --page raw --log-file``:
its ``==PROF==`` lines, a header row of ncu's identity columns and the requested metrics, a units
row, and per profiled case the marker kernel's row and one kernel row, every cell quoted. Column
names, units, number formats (thousands separators) and quoting follow a real H200 run's raw page
(tests/fixtures/ncu/raw_h200.csv).

It refuses (an ``==ERROR==`` line) a command line without --clock-control none, --csv, --page raw
or --profile-from-start off, and names its kernel after the uid it ran as, so tests see the sandbox.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

SCRIPT = r'''#!{python}
import csv, json, os, subprocess, sys

MODE = {mode!r}
COUNT = {count!r}
args = sys.argv[1:]
flags, log, i = {{}}, None, 0
while i < len(args) and args[i].startswith("--"):
    if args[i] == "--csv":
        flags["--csv"] = True
        i += 1
    else:
        flags[args[i]] = args[i + 1]
        i += 2
program = args[i:]
log = flags.get("--log-file")
out = open(log, "w") if log else sys.stdout
job = program[3]  # python -m optagent.worker fd:JOB_FD FD: a fresh open of the memfd leaves the worker's offset
labels = [c["label"] for c in json.load(open("/proc/self/fd/" + job[3:] if job.startswith("fd:") else job))["cases"]]
if COUNT:
    with open(COUNT, "a") as f:
        f.write("called\n")
wanted = {{"--clock-control": "none", "--csv": True, "--page": "raw", "--profile-from-start": "off"}}
bad = [k for k, v in wanted.items() if flags.get(k) != v]
if bad:
    out.write("==ERROR== fake ncu: missing " + " ".join(bad) + "\n")
    sys.exit(1)
rc = subprocess.run(program, close_fds=False).returncode
out.write("==WARNING== Note: Running with unmodified GPU clocks. If not controlled otherwise, profiling results "
          "may be inconsistent.\n==PROF== Connected to process 2 (/usr/bin/python3.12)\n")
if MODE == "no_counters":
    out.write("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
              "Counters on the target device 0. For instructions on enabling permissions and to get more "
              "information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n")
    out.write("==PROF== Disconnected from process 2\n==WARNING== No kernels were profiled.\n")
    sys.exit(rc)
out.write("==PROF== Disconnected from process 2\n")
metrics = sorted(flags["--metrics"].split(","))
ident = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
         "Grid Size", "Device", "CC"]
def unit(m):
    return "ns" if m.startswith("gpu__time_duration") else "%" if "pct_of_peak" in m else "inst"
def value(m, marker):
    if m.startswith("gpu__time_duration"):
        return "1,024" if marker else "156,864"
    if m.startswith("gpu__dram_throughput"):
        return "0.01" if marker else ("500" if MODE == "forged" else "81.50")
    if m.startswith("sm__throughput"):
        return "0.02" if marker else ("nan" if MODE == "forged" else "22.10")
    if m.startswith("sm__warps_active"):
        return "1.50" if marker else "37.00"
    reason = m[len("smsp__average_warps_issue_stalled_"):-len("_per_issue_active.ratio")]
    stalls = {{"long_scoreboard": "5.40", "wait": "1.20", "barrier": "0.60", "short_scoreboard": "0.30"}}
    return "0" if marker else stalls.get(reason, "0")
kernel = "_affine_uid%d" % os.getuid()
if MODE == "forged":
    kernel = "void _affine<float, \x1b[31mred\x1b[0m>(" + "x" * 5000 + ")"
w = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
w.writerow(ident + metrics)
if MODE == "garbled":
    out.write('"0","2","python3.12","127.0.0.1","_affine","1","7","(128, 1, 1)\n')
    sys.exit(rc)
w.writerow([""] * len(ident) + [unit(m) for m in metrics])
n = 0
for label in labels:
    for name, marker in (("void at::cuda::<unnamed>::spin_kernel(long)", True), (kernel, False)):
        w.writerow([str(n), "2", "python3.12", "127.0.0.1", name, "1", "7", "(128, 1, 1)", "(1056, 1, 1)", "0",
                    "9.0"] + [value(m, marker) for m in metrics])
        n += 1
sys.exit(rc)
'''


def write_fake_ncu(folder: Path, mode: str = "ok", count_file: Path | None = None) -> Path:
    """An executable ``ncu`` in ``folder``; mode ok, garbled, forged or no_counters. count_file, where
    the sandbox lets it write there, gets a line per call."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ncu"
    path.write_text(SCRIPT.format(python=sys.executable, mode=mode, count=str(count_file) if count_file else None))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.chmod(folder, 0o755)
    return path
