"""The judge started beside its candidate (evaluation/warm_worker.py) and the socket its job comes on (job_channel.py)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from optagent import job_channel
from optagent.evaluation import isolation, take_down, warm_worker
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.schema import Language, Mechanism, Status
from optagent.task import load_task

needs_bwrap = pytest.mark.skipif(isolation.mechanism() is not Mechanism.BWRAP,
                                 reason="a warm judge is started only under bubblewrap")


def test_the_job_and_its_descriptors_arrive_mapped_to_the_receivers_numbers():
    pipes = [os.pipe() for _ in range(450)]  # three messages of descriptors
    parent, child = socket.socketpair()
    job = b'{"mode": "judge"}' * 5000  # larger than one read
    sender = threading.Thread(target=job_channel.send, args=(parent, job, [r for r, _ in pipes]))
    sender.start()
    got, mapped = job_channel.receive(child)
    sender.join()
    parent.close()
    try:
        assert got == job and len(mapped) == len(pipes)
        for k, (r, w) in enumerate(pipes):
            os.write(w, str(k).encode())
            assert mapped[r] != r and os.read(mapped[r], 8) == str(k).encode()  # the same pipe, another number
    finally:
        for fd in [*mapped.values(), *(f for p in pipes for f in p)]:
            os.close(fd)


def test_a_socket_that_carries_other_descriptors_than_it_names_is_refused():
    parent, child = socket.socketpair()
    r, w = os.pipe()
    socket.send_fds(parent, [b"\0"], [r])
    parent.sendall(b'{"fds": [1, 2], "bytes": 2}\n{}')
    parent.shutdown(socket.SHUT_WR)
    with pytest.raises(ValueError, match="carried 1 descriptors"):
        job_channel.receive(child)
    for fd in (r, w):
        os.close(fd)
    parent.close()


class Recorder:
    """WarmWorker, watched: whether the judge that waited beside the candidate was used or taken down unused.
    Warm judges are a GPU's (warm_worker.available): here, on the CPU, they are asked for."""

    def __init__(self, monkeypatch):
        monkeypatch.setattr(warm_worker, "available", lambda device: True)
        self.made, self.ran, self.abandoned, self.alive_at_run = [], 0, 0, []
        real_init, real_run, real_abandon = (warm_worker.WarmWorker.__init__, warm_worker.WarmWorker.run,
                                             warm_worker.WarmWorker.abandon)
        rec = self

        def init(self, *a, **k):
            real_init(self, *a, **k)
            rec.made.append(self)

        def run(self, *a, **k):
            rec.ran += 1
            rec.alive_at_run.append(self.spawned.proc.poll() is None)
            return real_run(self, *a, **k)

        def abandon(self):
            rec.abandoned += 1
            return real_abandon(self)
        monkeypatch.setattr(warm_worker.WarmWorker, "__init__", init)
        monkeypatch.setattr(warm_worker.WarmWorker, "run", run)
        monkeypatch.setattr(warm_worker.WarmWorker, "abandon", abandon)


@needs_bwrap
def test_the_judge_waits_beside_the_candidate_and_judges_it(task_dir, monkeypatch):
    task = load_task(task_dir)
    rec = Recorder(monkeypatch)
    ev = SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 0, None, hidden=False)[:1], timeout_s=120)
    result = ev.evaluate(task.starter(Language.TRITON).source, Language.TRITON)
    assert result.status is Status.PASSED, result.reason
    assert len(rec.made) == 1 and rec.ran == 1 and rec.alive_at_run == [True]  # it had waited, warm
    take_down.reaped()  # it answered: its exit is waited for in the background
    assert rec.made[0].spawned.proc.poll() is not None  # and it is gone


@needs_bwrap
def test_a_wrong_kernel_is_still_found_by_the_warm_judge(task_dir, monkeypatch):
    task = load_task(task_dir)
    rec = Recorder(monkeypatch)
    source = task.starter(Language.TRITON).source
    head, sep, rest = source.partition("def run_kernel(\n")
    signature, colon, body = rest.partition("):\n")
    wrong = head + sep + signature + colon + body + "    output.mul_(1.5)\n"
    ev = SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 0, None, hidden=False)[:1], timeout_s=120)
    result = ev.evaluate(wrong, Language.TRITON)
    assert result.status is Status.INCORRECT, result.reason
    assert rec.ran == 1


@needs_bwrap
def test_a_judge_no_case_needs_is_taken_down_unused(task_dir, monkeypatch):
    task = load_task(task_dir)
    rec = Recorder(monkeypatch)
    source = task.starter(Language.TRITON).source.replace("def run_kernel(", "raise RuntimeError('no kernel today')\n\n\ndef run_kernel(", 1)
    ev = SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 0, None, hidden=False)[:1], timeout_s=120,
                          static_scan=False)
    result = ev.evaluate(source, Language.TRITON)
    assert result.status is Status.COMPILE_ERROR and "no kernel today" in (result.reason or "")  # at import
    assert len(rec.made) == 1 and rec.ran == 0 and rec.abandoned == 1
    assert rec.made[0].spawned.proc.poll() is not None  # killed, not left waiting


@needs_bwrap
def test_a_warm_judge_that_died_while_it_waited_is_replaced_by_a_fresh_one(task_dir, monkeypatch):
    task = load_task(task_dir)
    rec = Recorder(monkeypatch)
    real_init = warm_worker.WarmWorker.__init__

    def killed(self, *a, **k):  # a fault: the waiting judge is killed before its candidate ends
        real_init(self, *a, **k)
        os.killpg(self.spawned.proc.pid, 9)
        self.spawned.proc.wait()
    monkeypatch.setattr(warm_worker.WarmWorker, "__init__", killed)
    ev = SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 0, None, hidden=False)[:1], timeout_s=120)
    result = ev.evaluate(task.starter(Language.TRITON).source, Language.TRITON)
    assert result.status is Status.PASSED, result.reason  # judged all the same, by a judge started then
    assert rec.ran == 0 and result.cases[0].rel_err is not None  # the dead one was handed nothing


def test_warm_judges_are_a_gpus_under_bubblewrap(monkeypatch):
    from optagent.schema import Device

    assert not warm_worker.available(Device.CPU)  # the CPU referee's windows are not shared with a judge's imports
    monkeypatch.setattr(isolation, "mechanism", lambda: Mechanism.LANDLOCK)
    assert not warm_worker.available(Device.CUDA)
    monkeypatch.setattr(isolation, "mechanism", lambda: Mechanism.BWRAP)
    assert warm_worker.available(Device.CUDA)


def test_a_warm_worker_has_hashed_tritons_own_files_before_its_job_comes():
    """Every Triton kernel's cache key starts with the hash of Triton's own files (libtriton read whole: 0.4 s of a
    candidate's first compile on the H200); a warm worker computes it while it waits (worker/__main__.py warm_up)."""
    import subprocess
    import sys

    code = ("from optagent.worker.__main__ import warm_up\nfrom triton.runtime.cache import triton_key\n"
            "assert triton_key.cache_info().currsize == 0\nwarm_up()\nprint(triton_key.cache_info().currsize)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "1"
