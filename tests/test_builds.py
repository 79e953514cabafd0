"""A passed kernel's own compiled code kept for its next evaluation (evaluation/builds.py): only regular files,
nothing a link points at, only to the same source, never over a file the process there made itself."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from optagent.evaluation import builds
from optagent.evaluation.builds import Builds
from optagent.evaluation.cases import select_cases
from optagent.evaluation.evaluator import SandboxEvaluator
from optagent.schema import Language, Status
from optagent.task import load_task

SHA = "a" * 64


def _scratch(tmp_path: Path) -> tuple[Path, int]:
    scratch = tmp_path / "scratch"
    (scratch / ".triton" / "k1").mkdir(parents=True)
    (scratch / ".triton" / "k1" / "kernel.cubin").write_bytes(b"cubin")
    (scratch / ".triton" / "k1" / "launcher.so").write_bytes(b"so")
    secret = tmp_path / "parent-only.txt"
    secret.write_text("the parent's")
    (scratch / ".triton" / "k1" / "link").symlink_to(secret)
    os.mkfifo(scratch / ".triton" / "k1" / "fifo")
    return scratch, os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)


def test_kept_builds_are_regular_files_only_and_go_to_the_same_source(tmp_path):
    scratch, fd = _scratch(tmp_path)
    store = Builds(tmp_path / "store")
    try:
        store.keep(SHA, fd)
    finally:
        os.close(fd)
    kept = tmp_path / "store" / SHA / ".triton" / "k1"
    assert sorted(p.name for p in kept.iterdir()) == ["kernel.cubin", "launcher.so"]  # no link, no FIFO
    new = tmp_path / "next"
    new.mkdir()
    assert not store.lend("b" * 64, new) and not (new / ".triton").exists()  # another source gets nothing
    assert store.lend(SHA, new)
    assert (new / ".triton" / "k1" / "kernel.cubin").read_bytes() == b"cubin"


def test_a_lent_build_never_overwrites_what_the_process_made(tmp_path):
    scratch, fd = _scratch(tmp_path)
    store = Builds(tmp_path / "store")
    store.keep(SHA, fd)
    os.close(fd)
    spare = tmp_path / "spare"
    (spare / ".triton" / "k1").mkdir(parents=True)
    (spare / ".triton" / "k1" / "launcher.so").write_bytes(b"the spare's own, loaded")
    assert store.lend(SHA, spare)
    assert (spare / ".triton" / "k1" / "launcher.so").read_bytes() == b"the spare's own, loaded"
    assert (spare / ".triton" / "k1" / "kernel.cubin").read_bytes() == b"cubin"


def test_an_entry_over_the_limit_is_not_kept_and_the_store_keeps_the_newest(tmp_path, monkeypatch):
    scratch, fd = _scratch(tmp_path)
    store = Builds(tmp_path / "store")
    monkeypatch.setattr(builds, "MAX_BYTES", 4)
    store.keep(SHA, fd)
    assert not (tmp_path / "store" / SHA).exists()
    monkeypatch.setattr(builds, "MAX_BYTES", 1 << 20)
    monkeypatch.setattr(builds, "MOST", 2)
    shas = [hashlib.sha256(bytes([i])).hexdigest() for i in range(3)]
    for i, sha in enumerate(shas):
        store.keep(sha, fd)
        os.utime(tmp_path / "store" / sha, (1000 + i, 1000 + i))
    os.close(fd)
    store.keep(SHA, os.open(scratch, os.O_RDONLY | os.O_DIRECTORY))
    left = sorted(p.name for p in (tmp_path / "store").iterdir())
    assert left == sorted([shas[2], SHA])  # the two newest


def test_a_lent_triton_cache_is_found_by_tritons_own_cache_manager(tmp_path, monkeypatch):
    """Triton's group file names each file of a compiled kernel by its absolute path: the first process's scratch,
    gone by the time the kernel is evaluated again. Lent, the group names the copies, and Triton finds them."""
    from triton.runtime.cache import FileCacheManager
    first = tmp_path / "eval-1"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(first / ".triton"))
    made = FileCacheManager("k1")
    group = {name: made.put(b"compiled " + name.encode(), name) for name in ("kernel.json", "kernel.cubin")}
    made.put_group("kernel.json", group)
    bad = FileCacheManager("k2")  # a group not Triton's: it names a file elsewhere
    bad.put(b"x", "kernel.json")
    bad.put_group("kernel.json", {"kernel.json": str(tmp_path / "parent-only.txt")})
    store = Builds(tmp_path / "store")
    fd = os.open(first, os.O_RDONLY | os.O_DIRECTORY)
    try:
        store.keep(SHA, fd)
    finally:
        os.close(fd)
    shutil.rmtree(first)  # the first evaluation's scratch directory, gone
    new = tmp_path / "eval-2"
    new.mkdir()
    assert store.lend(SHA, new)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(new / ".triton"))
    found = FileCacheManager("k1").get_group("kernel.json")
    assert found == {name: str(new / ".triton" / "k1" / name) for name in group}
    assert Path(found["kernel.cubin"]).read_bytes() == b"compiled kernel.cubin"
    assert FileCacheManager("k2").get_group("kernel.json") is None  # dropped: that kernel compiles again


@pytest.mark.gpu
def test_a_kernel_evaluated_again_starts_with_its_own_compiled_code(task_dir, tmp_path):
    task = load_task(task_dir)
    ev = SandboxEvaluator(task, "cuda", select_cases(task, "cuda", 12, "1,2", hidden=False), scratch_root=tmp_path,
                          keep_scratch=True)
    source = task.starter(Language.TRITON).source
    first = ev.evaluate(source, Language.TRITON)
    assert first.status is Status.PASSED, first.reason
    sha = hashlib.sha256(source.encode()).hexdigest()
    kept = {p.relative_to(tmp_path / "builds" / sha) for p in (tmp_path / "builds" / sha).rglob("*") if p.is_file()}
    assert any(p.suffix == ".cubin" for p in kept), kept
    made = {p: (tmp_path / "builds" / sha / p).stat().st_mtime_ns for p in kept if p.suffix == ".cubin"}
    second = ev.evaluate(source, Language.TRITON)
    assert second.status is Status.PASSED, second.reason
    newest = max(tmp_path.glob("eval-*"), key=lambda p: p.stat().st_mtime)
    assert all((newest / p).is_file() for p in kept)
    # found by Triton where they were lent (repoint_groups), not compiled again over them
    assert all((newest / p).stat().st_mtime_ns == t for p, t in made.items()), made


def test_on_a_cpu_a_kernel_evaluated_again_finds_its_target_compiles_where_they_were_lent(task_dir, tmp_path):
    """CPU mode compiles a Triton candidate's launches for the target GPU (worker/target_compile.py) through Triton's
    own cache: the second evaluation of the same source finds them lent, and compiles none of them again."""
    task = load_task(task_dir)
    ev = SandboxEvaluator(task, "cpu", select_cases(task, "cpu", 0, None, hidden=False)[:1], scratch_root=tmp_path,
                          keep_scratch=True, target_facts=True)
    source = task.starter(Language.TRITON).source
    first = ev.evaluate(source, Language.TRITON)
    assert first.status is Status.PASSED, first.reason
    entry = tmp_path / "builds" / hashlib.sha256(source.encode()).hexdigest()
    made = {p.relative_to(entry): p.stat().st_mtime_ns for p in entry.rglob("*.cubin")}
    assert made, "no target compile was kept"
    second = ev.evaluate(source, Language.TRITON)
    assert second.status is Status.PASSED, second.reason
    newest = max(tmp_path.glob("eval-*"), key=lambda p: p.stat().st_mtime)
    assert all((newest / p).stat().st_mtime_ns == t for p, t in made.items()), "compiled again over the lent ones"
