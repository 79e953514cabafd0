"""The parent as a confused deputy: what the trusted side does in a directory the candidate could write.

Unit tests of evaluation/safe_files.py (links, FIFOs, planted names), and the attack fixtures that plant
them run through the real evaluator with the static scan and the in-process guard both off, under each
isolation this machine has: the parent never follows a link there, never blocks on a FIFO, and the judge
reads only the files the parent opened.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
from pathlib import Path

import pytest

from attack_fixtures import attack_source  # tests/ is on sys.path
from optagent.evaluation import isolation
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.evaluation.cases import select_cases
from optagent.evaluation.safe_files import UnsafeFile, create, job_fd, open_dir, open_regular, open_samples, read_regular
from optagent.messages import ExpectedSample, Job, Sample
from optagent.schema import Language, Status
from optagent.task import load_task

FIXTURE_TARGET = "/tmp/optagent_attack_deputy_target"  # the path the fixture names; each test swaps in its own
PLANTED_MARK = "/tmp/optagent_attack_planted_module"  # plant_module's, likewise


def mechanisms() -> list[str]:
    """The isolations that contain a candidate on this machine (the fallback forced where bwrap is here)."""
    found = []
    if shutil.which("bwrap"):
        found.append("bwrap")
    found.append("landlock")
    return found


# ---------------------------------------------------------------------------- safe_files, alone

def test_create_replaces_a_planted_link_and_fifo_without_touching_their_targets(tmp_path):
    target = tmp_path / "host-file"
    target.write_text("untouched")
    d = tmp_path / "scratch"
    d.mkdir()
    (d / "judge.log").symlink_to(target)
    os.mkfifo(d / "candidate.log")
    dfd = open_dir(d)
    try:
        for name in ("judge.log", "candidate.log"):
            fd = create(dfd, name)
            os.write(fd, b"log")
            os.close(fd)
            assert stat.S_ISREG(os.lstat(d / name).st_mode) and (d / name).read_bytes() == b"log"
        (d / "job-judge.json").mkdir()
        with pytest.raises(UnsafeFile, match="cannot be replaced"):
            create(dfd, "job-judge.json")
    finally:
        os.close(dfd)
    assert target.read_text() == "untouched"


def test_open_regular_refuses_links_fifos_and_directories_without_blocking(tmp_path):
    (tmp_path / "real.pt").write_bytes(b"data")
    (tmp_path / "link.pt").symlink_to(tmp_path / "real.pt")
    os.mkfifo(tmp_path / "fifo.pt")
    (tmp_path / "dir.pt").mkdir()
    dfd = open_dir(tmp_path)
    try:
        fd = open_regular(dfd, "real.pt")
        assert os.read(fd, 10) == b"data"
        os.close(fd)
        for name in ("link.pt", "fifo.pt", "dir.pt", "missing.pt"):
            with pytest.raises(UnsafeFile):
                open_regular(dfd, name)
    finally:
        os.close(dfd)
    assert read_regular(tmp_path / "real.pt", 2) == b"da"
    assert read_regular(tmp_path / "fifo.pt", 10) == b"" and read_regular(tmp_path / "link.pt", 10) == b""
    (tmp_path / "linkdir").symlink_to(tmp_path)
    assert read_regular(tmp_path / "linkdir" / "real.pt", 10) == b""  # a linked directory is no better


def test_job_travels_in_memory_not_on_disk():
    job = Job(mode="judge", task_dir="/x", device="cpu", nonce="n" * 32, scratch="/nowhere")
    fd = job_fd(job)
    try:
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:optagent-job-judge")
        assert Job.model_validate_json(os.read(fd, 1 << 20)) == job
    finally:
        os.close(fd)


def test_the_judge_gets_only_the_files_the_parent_names_and_opens(tmp_path):
    scratch = tmp_path / "eval"
    (scratch / "outputs").mkdir(parents=True)
    (scratch / "outputs" / "smoke-1-given.pt").write_bytes(b"saved")
    os.mkfifo(scratch / "outputs" / "smoke-1-fresh-1.pt")
    claims = [Sample(name="given", file="/etc/passwd", sha256="0"),  # the path claimed is never used
              Sample(name="fresh-1", file=str(scratch / "outputs/smoke-1-fresh-1.pt"), sha256="0"),
              Sample(name="../../etc/passwd", file="/etc/passwd", sha256="0"),
              *[Sample(name=f"extra-{i}", file="x", sha256="0") for i in range(40)]]
    job = Job(mode="judge", task_dir="/x", device="cpu", nonce="n" * 32, scratch=str(scratch),
              outputs_dir=str(scratch / "outputs"), samples={"smoke-1": claims},
              expected={"smoke-1": [ExpectedSample(name="given"), ExpectedSample(name="fresh-1")]})
    judged, fds = open_samples(job, None)
    try:
        given, fresh, escape, *extra = judged.samples["smoke-1"]
        assert given.file == "smoke-1-given.pt" and os.read(given.fd, 10) == b"saved"
        assert fresh.fd is None and escape.fd is None and escape.file == ""
        assert len(extra) == 15 and all(s.fd is None for s in extra)  # 16 unasked ones at most, the escape one of them
        assert fds == [given.fd]
    finally:
        for fd in fds:
            os.close(fd)
    (scratch / "outputs").rename(scratch / "outputs.real")
    (scratch / "outputs").symlink_to(scratch / "outputs.real")
    judged, fds = open_samples(job, None)
    assert fds == [] and all(s.fd is None for s in judged.samples["smoke-1"])


# ---------------------------------------------------------------------------- the fixtures, end to end

@pytest.fixture(scope="module")
def task(task_dir):
    return load_task(task_dir)


def evaluate(task, name: str, mechanism: str, monkeypatch, timeout: float = 120.0, source: str | None = None):
    monkeypatch.setenv(isolation.ENV, mechanism)
    cases = [c for c in select_cases(task, "cpu", 0, None, hidden=False) if c.label == "smoke-1"]
    ev = SandboxEvaluator(task, "cpu", cases, timeout_s=timeout, static_scan=False, guard=False)
    done: list = []
    worker = threading.Thread(target=lambda: done.append(ev.evaluate(source or attack_source(name), Language.TRITON)), daemon=True)
    worker.start()
    worker.join(3 * timeout)  # the old parent blocked on a FIFO for ever: the test must not
    assert done, f"{name}: the evaluation did not end (the parent blocked)"
    return done[0]


@pytest.mark.parametrize("mechanism", mechanisms())
def test_planted_fifos_block_nothing(task, mechanism, monkeypatch):
    result = evaluate(task, "plant_fifo", mechanism, monkeypatch)
    assert result.status is Status.PASSED, result.reason


@pytest.mark.parametrize("mechanism", mechanisms())
def test_planted_symlinks_redirect_nothing(task, mechanism, monkeypatch, tmp_path):
    # A host file of this test's own: the mechanisms' cases run at once on two xdist workers, and a shared
    # path was made by one while the other's clean-up removed it.
    target = tmp_path / "deputy-target"
    target.write_text("untouched")
    source = attack_source("plant_symlink")
    assert FIXTURE_TARGET in source
    result = evaluate(task, "plant_symlink", mechanism, monkeypatch, source=source.replace(FIXTURE_TARGET, str(target)))
    assert target.read_text() == "untouched" and not target.is_symlink()
    assert result.status is Status.PASSED, result.reason


@pytest.mark.parametrize("mechanism", mechanisms())
def test_modules_planted_in_the_scratch_directory_never_run_in_the_judge(task, mechanism, monkeypatch, tmp_path):
    # The judge starts in the candidate's scratch directory; `python -m` would import a planted package first.
    mark = tmp_path / "planted-module-ran"
    source = attack_source("plant_module")
    assert PLANTED_MARK in source
    result = evaluate(task, "plant_module", mechanism, monkeypatch, source=source.replace(PLANTED_MARK, str(mark)))
    assert not mark.exists()
    assert result.status is Status.PASSED, result.reason


def test_the_judges_compiler_caches_are_out_of_the_candidates_reach(tmp_path):
    from optagent.cache import cache_root
    from optagent.evaluation.worker_command import command
    from optagent.evaluation.limits import limits_for

    scratch = tmp_path / "eval"
    scratch.mkdir()
    for mode, inside in (("candidate", True), ("judge", False)):
        job = Job(mode=mode, task_dir="/x", device="cpu", nonce="n" * 32, scratch=str(scratch))
        argv, env = command(job, scratch, "fd:9", 8, "m", isolation.mechanism(), limits_for("cpu"))
        for name in ("TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "TILELANG_CACHE_DIR"):
            assert Path(env[name]).is_relative_to(scratch) is inside, (mode, name, env[name])
            assert inside or Path(env[name]).is_relative_to(cache_root())
        assert "optagent.worker" in " ".join(argv) and "-m" not in argv[argv.index("-c") - 1:]


@pytest.mark.parametrize("mechanism", mechanisms())
def test_outputs_behind_a_link_are_not_judged(task, mechanism, monkeypatch):
    result = evaluate(task, "outputs_link", mechanism, monkeypatch)
    assert result.status is Status.REJECTED, result.reason
    assert "not a regular file the harness saved" in (result.reason or "")
