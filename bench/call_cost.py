"""Where one timed call's milliseconds go, piece by piece (issue 31).

    python bench/call_cost.py [PACKAGE_DIR] [KERNEL] [--cases 1,6,12] [--calls 40] [--busy-thread] [--variants]

A timed loop costs about 2.2 ms a call on an H100 for kernels of 35-180 us (docs/gpu.md, 2026-12-07): the harness's
work around each call, not the call. This bench takes a package's starter (or KERNEL, a Python kernel file) and, per
case, runs in this process what the harness runs around every timed call, with a referee of its own (the parent's
class, its native clock between the pipes as in a run), in two loops:

- piece by piece, a device sync after each piece: the L2 flush, the host probe, the T and D marks' round trips, the
  call, then the after-work's pieces (the outputs' copy, their digest, the R question, the poison, the in/out
  tensors put back, the redraw of the read-only inputs);
- as the harness runs it (no extra syncs): the whole call-to-call time.

and the case's one-off costs: making its inputs, the after-work's set-up, loading a fresh copy of the kernel.
The digests go through timer.c's kernel as in a candidate's process (--torch-digest: the formula the judge uses).
--variants instead times the call (as the timer does, and by events) after each kind of time between calls
(VARIANTS below), their loops interleaved: what the harness's own work between calls does to the next call's time.
--busy-thread keeps a pure-Python thread spinning in this process, as a parent's other work would: the referee's
thread then waits for Python's lock to answer R. A bench, never a run's path: the kernel runs in this process.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from optagent.evaluation import referee as referee_mod
from optagent.evaluation.cases import parse_case_list
from optagent.messages import CaseSpec
from optagent.schema import CaseKind, Device, Language
from optagent.task import load_task
from optagent.worker import bench, host_speed, referee_client
from optagent.worker.after_work import AfterWork
from optagent.worker.backends import backend_for
from optagent.worker.digests import outputs_digest
from optagent.worker.harness import TaskRuntime, refresh_floats

ROOT = Path(__file__).resolve().parents[1]
SYNC = torch.cuda.synchronize
PIECES = ("flush", "probe", "T", "call", "D", "clone", "digest", "R", "poison", "inouts", "redraw")


def geomean(xs: list[float]) -> float:
    return statistics.geometric_mean(xs) if xs and min(xs) > 0 else float("nan")


class BenchReferee(referee_mod.Referee):
    """The parent's referee; ``lenient``: a loop's T may follow its D without an R (--variants without the
    harness's after-work)."""

    lenient = False

    def _in_turn(self, lp, kind, window_us):
        why = super()._in_turn(lp, kind, window_us)
        if self.lenient and kind == "D":  # no R: the next call's T, its time between from D's answer
            lp.expect, lp.digest_us = "T", 0.0
        return why


def attach_referee(device: Device) -> referee_mod.Referee:
    """A referee for this process's own harness: its pipes' child ends kept (duplicated) here."""
    ref = BenchReferee(spin_s=referee_mod.SPIN_S[device])
    answers, questions = (os.dup(fd) for fd in ref.child_fds)
    ref.started()
    referee_client._FDS = (answers, questions)
    return ref


def native_digests() -> str:
    """The harness's digests through timer.c's kernel, as a candidate process has them (worker/timers.py)."""
    from optagent.evaluation.native_build import native_timer
    from optagent.worker import digests

    spec = native_timer()
    if spec is None:
        return "the torch formula (no native timer here)"
    loader = importlib.machinery.ExtensionFileLoader("_optagent_timer", spec.path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("_optagent_timer", spec.path,
                                                                                    loader=loader))
    loader.exec_module(module)
    secret_r, secret_w = os.pipe()
    os.write(secret_w, bytes(32))
    os.close(secret_w)
    module.init(secret_r, os.open(os.devnull, os.O_WRONLY), True, 1, 1, 0, 0.0)
    module.cuda_setup()
    digests.use_native(module.digest)
    return "timer.c's kernel"


def pieces_loop(label: str, fn, args: list, work: AfterWork, timer: bench.Timer, calls: int) -> dict[str, list]:
    out: dict[str, list] = {p: [] for p in PIECES}
    sync, clock = SYNC, time.perf_counter
    work.begin_loop()
    with referee_client.timed_loop(f"{label}p", False, 1, 4):
        for call in range(calls):
            t = [clock()]
            timer.flush_l2(); sync(); t.append(clock())
            host_speed.probe_us(); t.append(clock())
            referee_client.mark("T"); t.append(clock())
            fn(*args); sync(); t.append(clock())
            referee_client.mark("D"); t.append(clock())
            outs = {j: args[j].detach().clone() for j in work.outs}; sync(); t.append(clock())
            digest = outputs_digest({j: args[j] for j in work.outs}); t.append(clock())
            _, seed, _, _ = referee_client.ask(f"R {call} 0 {digest}"); t.append(clock())
            work.poison_set(args); sync(); t.append(clock())
            work.put_back(0); sync(); t.append(clock())
            refresh_floats(args, int(seed), work.scales[0]); sync(); t.append(clock())
            del outs
            for name, a, b in zip(PIECES, t, t[1:]):
                out[name].append((b - a) * 1e6)
    return out


def harness_loop(label: str, fn, args: list, work: AfterWork, timer: bench.Timer, calls: int) -> list[float]:
    """Call-to-call time as the harness runs it (worker/native/timer.c's loop, in Python)."""
    sync, clock = SYNC, time.perf_counter
    work.begin_loop()
    per: list[float] = []
    with referee_client.timed_loop(f"{label}h", False, 1, 4):
        last = clock()
        for call in range(calls):
            timer.flush_l2(); sync()
            host_speed.probe_us()
            referee_client.mark("T")
            fn(*args); sync()
            referee_client.mark("D")
            work(call, 0, 0, False, -1)
            now = clock()
            per.append((now - last) * 1e6)
            last = now
    return per


# --variants: what the time between calls does to the next call. Each loop times the call as the timer does
# (perf_counter around the call and its sync) and by events around it (the GPU's share), after one of:
#   full      the harness's after-work (the referee asked, outputs kept, digested, poisoned, inputs redrawn)
#   noR       the same work without the referee's question (nor the digest told there)
#   spinR     full, every answer (R's, the marks') awaited spinning (timer.c spins for its marks'), not blocking
#   light     the in/out tensors put back only (what a timing-only loop would need)
#   redraw    light, then the read-only inputs redrawn (the after-work's bandwidth, none of the rest)
#   digest    light, then the outputs copied and digested (no R, no redraw)
#   sleep     light, then 0.5 ms asleep (the host's core idle, as while the worker waits on the referee's pipe)
#   pollute   light, then 32 MiB copied on the host (its caches filled with other data)
VARIANTS = ("full", "noR", "spinR", "light", "redraw", "digest", "sleep", "pollute")
_JUNK = bytearray(32 << 20)


blocking_ask = referee_client.ask  # the harness's, put back after a spinR loop


def variant_loop(ref, name: str, fn, args: list, work: AfterWork, timer: bench.Timer, calls: int):
    sync, clock = SYNC, time.perf_counter
    cuda = SYNC is torch.cuda.synchronize  # the CPU smoke test: no events
    start, end = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else (None, None)
    ref.lenient = name not in ("full", "spinR")  # its loops then take T and D without R between (BenchReferee)
    work.refereed = not ref.lenient
    referee_client.ask = spinning_ask if name == "spinR" else blocking_ask  # the marks' answers too, as timer.c's
    os.set_blocking(referee_client._FDS[0], name != "spinR")
    eager, gpu = [], []
    work.begin_loop()
    with referee_client.timed_loop(f"{name}{len(ref.loops)}", False, 1, 4):
        for call in range(calls):
            timer.flush_l2(); sync()
            host_speed.probe_us()
            referee_client.mark("T")
            t0 = clock()
            if cuda:
                start.record()
            fn(*args)
            if cuda:
                end.record()
            sync()
            eager.append((clock() - t0) * 1e6)
            referee_client.mark("D")
            gpu.append(start.elapsed_time(end) * 1e3 if cuda else 0.0)
            if name in ("full", "spinR", "noR"):
                work(call, 0, call + 1, False, -1)
            else:
                work.put_back(0)
            if name == "redraw":
                refresh_floats(args, call + 1, work.scales[0])
            elif name == "digest":
                outputs_digest({j: args[j].detach().clone() for j in work.outs})
            elif name == "sleep":
                time.sleep(0.0005)
            elif name == "pollute":
                bytes(_JUNK)
    work.refereed, ref.lenient, referee_client.ask = True, False, blocking_ask
    os.set_blocking(referee_client._FDS[0], True)
    return eager, gpu


def spinning_ask(question: str) -> list[str]:
    answers, questions = referee_client._FDS
    os.write(questions, question.encode("ascii") + b"\n")
    line = b""
    while not line.endswith(b"\n"):
        try:
            line += os.read(answers, 256)
        except BlockingIOError:
            pass
    return line.decode("ascii").split()


def variants(ref, label: str, fn, args: list, work: AfterWork, timer: bench.Timer, calls: int) -> dict:
    """Each variant's median eager and GPU us, its loops interleaved over three rounds (drift spread evenly)."""
    got: dict[str, tuple[list, list]] = {v: ([], []) for v in VARIANTS}
    for _ in range(3):
        for v in VARIANTS:
            e, g = variant_loop(ref, v, fn, args, work, timer, calls)
            got[v][0].extend(e)
            got[v][1].extend(g)
    return {v: (statistics.median(e), statistics.median(g)) for v, (e, g) in got.items()}


def spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("package", nargs="?", default=str(ROOT / "tasks" / "flashattn_task_package"))
    p.add_argument("kernel", nargs="?")
    p.add_argument("--cases", default="")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--busy-thread", action="store_true")
    p.add_argument("--variants", action="store_true", help="the next call's time after each kind of time between "
                   "calls (VARIANTS), instead of the pieces")
    p.add_argument("--torch-digest", action="store_true", help="the digests by the torch formula, not timer.c's kernel")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: the bench's own smoke test "
                   "(Triton's interpreter, cases cut to 4096 elements)")
    a = p.parse_args()
    global SYNC
    device = Device(a.device)
    SYNC = torch.cuda.synchronize if device is Device.CUDA else (lambda: None)
    task = load_task(Path(a.package))
    kernel = Path(a.kernel) if a.kernel else task.starter(Language.TRITON).path
    rt = TaskRuntime(str(task.root), device.value)
    indices = parse_case_list(a.cases, rt.num_cases()) if a.cases else list(range(1, rt.num_cases() + 1))
    backend = backend_for(Language.TRITON, device, None, 120.0)
    scratch = Path(tempfile.mkdtemp(prefix="call_cost-"))
    backend.prepare(kernel, scratch)
    timer = bench.Timer(device, 3, 3, 0.0, 1)
    how = native_digests() if device is Device.CUDA and not a.torch_digest else "the torch formula"
    ref = attach_referee(device)
    stop = threading.Event()
    if a.busy_thread:
        threading.Thread(target=spin, args=(stop,), daemon=True).start()
    print(f"{task.root.name}: {kernel.name}, {a.calls} calls a loop, busy thread: {a.busy_thread}; digests: {how}; "
          f"{torch.cuda.get_device_name(0) if device is Device.CUDA else 'cpu'}; flush buffer "
          f"{timer._flush.numel() >> 20 if timer._flush is not None else 0} MiB")
    print(f"{'case':>4} {'in MiB':>7} {'make ms':>7} {'work ms':>7} {'load ms':>7} "
          + " ".join(f"{n:>6}" for n in PIECES) + f" {'sum':>6} {'loop':>6}   (median us a call)")
    totals = {n: 0.0 for n in PIECES} | {"sum": 0.0, "loop": 0.0}
    vtotals: dict[str, tuple[list, list]] = {v: ([], []) for v in VARIANTS}
    for index in indices:
        case = CaseSpec(label=str(index), kind=CaseKind.CONTEST, index=index,
                        max_elements=4096 if device is Device.CPU else None)
        t0 = time.perf_counter()
        args = rt.make_args(case, 1)[0]
        SYNC()
        t1 = time.perf_counter()
        work = AfterWork([args], rt.outputs(args), rt.roles(args).inouts)
        work.poison_all()
        SYNC()
        t2 = time.perf_counter()
        fn = backend.load_fresh(f"c{index}")
        for _ in range(5):
            fn(*args)
        SYNC()
        t3 = time.perf_counter()
        mib = sum(t.numel() * t.element_size() for t in work.scales[0].values()) / 2**20
        if a.variants:
            got = variants(ref, str(index), fn, args, work, timer, a.calls)
            for v, (e, g) in got.items():
                vtotals[v][0].append(e)
                vtotals[v][1].append(g)
            print(f"{index:>4} eager/gpu us: " + "  ".join(f"{v} {e:.1f}/{g:.1f}" for v, (e, g) in got.items()),
                  flush=True)
            continue
        pieces = {n: statistics.median(v) for n, v in pieces_loop(str(index), fn, args, work, timer, a.calls).items()}
        loop = statistics.median(harness_loop(str(index), fn, args, work, timer, a.calls))
        row = pieces | {"sum": sum(pieces.values()), "loop": loop}
        for n in totals:
            totals[n] += row[n]
        print(f"{index:>4} {mib:>7.0f} {(t1 - t0) * 1e3:>7.1f} {(t2 - t1) * 1e3:>7.1f} {(t3 - t2) * 1e3:>7.1f} "
              + " ".join(f"{row[n]:>6.0f}" for n in PIECES) + f" {row['sum']:>6.0f} {row['loop']:>6.0f}", flush=True)
        work.clear()
        del args, work
    if a.variants:
        full = vtotals["full"]
        print("geomean eager/gpu us, and eager against full's: " + "  ".join(
            f"{v} {geomean(e):.1f}/{geomean(g):.1f} ({geomean(e) / geomean(full[0]):.3f})" for v, (e, g) in vtotals.items()))
    else:
        print(f"{'all':>4} {'':>7} {'':>7} {'':>7} {'':>7} " + " ".join(f"{totals[n]:>6.0f}" for n in PIECES)
              + f" {totals['sum']:>6.0f} {totals['loop']:>6.0f}   (sums over the cases)")
    stop.set()
    if ref.violation:
        print(f"referee: {ref.violation}")


if __name__ == "__main__":
    main()
