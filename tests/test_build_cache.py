"""The CUDA build cache: filled only by trusted code, and a cached library used only if it is the
one that was built (its sha256 recorded beside it); a planted or swapped one is built again. A candidate's
own object, lent to its next evaluation (evaluation/builds.py), is scanned again before it is linked."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from optagent.cache import CUDA_BUILDS
from optagent.evaluation.builds import Builds
from optagent.schema import Device
from optagent.worker.backends.base import Refused
from optagent.worker.backends.cuda import CudaBackend, record_build, verified_build

ROOT = Path(__file__).resolve().parents[1]
ATTACKS = ROOT / "tests" / "attacks"
SHA = "c" * 64


def test_a_cached_library_is_used_only_with_the_hash_it_was_built_with(tmp_path):
    lib, facts = tmp_path / "k.so", tmp_path / "k.facts.json"
    lib.write_bytes(b"\x7fELF built")
    facts.write_text(json.dumps({"sha256": hashlib.sha256(lib.read_bytes()).hexdigest(), "facts": []}))
    assert verified_build(lib, facts) == []
    lib.write_bytes(b"\x7fELF planted")  # swapped after the build
    assert verified_build(lib, facts) is None
    facts.write_text(json.dumps([]))  # a record from before hashes were kept, or a planted one without
    assert verified_build(lib, facts) is None
    facts.unlink()
    assert verified_build(lib, facts) is None


NEEDS_NVCC = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("nm") is None, reason="needs nvcc and nm")


def _copy(src: Path, scratch: Path) -> Path:
    scratch.mkdir(parents=True)
    out = scratch / "candidate.cu"
    out.write_text(src.read_text())
    return out


@NEEDS_NVCC
def test_a_passed_cuda_kernels_object_is_lent_scanned_again_and_linked_without_a_compile(tmp_path, monkeypatch):
    """A CUDA kernel evaluated again (a re-time) compiled its source again: 1.6-2.4 s a kernel on the H200. Its
    object and ptxas's facts are kept with its Triton cache (evaluation/builds.py) and lent to the next process
    for the same source, which scans the object again (its first process ran the kernel after the scan) and only
    links it; a lent object rewritten to call system() is compiled again (its record's hash no longer holds) or,
    with its record rewritten too, refused as a compiled one would be."""
    starter = ROOT / "tasks" / "flashattn_task_package" / "starter" / "decode_cuda.cu"
    first = CudaBackend(Device.CPU, None, 600)
    first.prepare(_copy(starter, tmp_path / "first"), tmp_path / "first")
    assert first.kernel_facts  # ptxas -v's registers per kernel
    store = Builds(tmp_path / "store")
    fd = os.open(tmp_path / "first", os.O_RDONLY | os.O_DIRECTORY)
    try:
        store.keep(SHA, fd)
    finally:
        os.close(fd)
    commands: list[list[str]] = []
    real_run = CudaBackend._run
    monkeypatch.setattr(CudaBackend, "_run", lambda self, cmd, *a: commands.append(cmd) or real_run(self, cmd, *a))
    second_src = _copy(starter, tmp_path / "second")
    assert store.lend(SHA, tmp_path / "second")
    second = CudaBackend(Device.CPU, None, 600)
    second.prepare(second_src, tmp_path / "second")
    assert len(commands) == 1 and "-c" not in commands[0]  # the link alone
    assert second.kernel_facts == first.kernel_facts and second.library.is_file()

    (obj,) = (tmp_path / "second" / CUDA_BUILDS).glob("*.o")
    attack = _copy(ATTACKS / "cuda_system.cu", tmp_path / "attack")
    real_run(second, second._command(obj, attack, "-arch=sm_90", compile_only=True), tmp_path / "attack", attack)

    def lent_to(name: str) -> Path:  # the second scratch's build folder, lent as if kept
        src = _copy(starter, tmp_path / name)
        (tmp_path / name / CUDA_BUILDS).mkdir()
        for f in (tmp_path / "second" / CUDA_BUILDS).iterdir():
            (tmp_path / name / CUDA_BUILDS / f.name).write_bytes(f.read_bytes())
        return src

    commands.clear()
    stale = CudaBackend(Device.CPU, None, 600)
    stale.prepare(lent_to("stale"), tmp_path / "stale")  # rewritten, its record not: compiled again from source
    assert any("-c" in c for c in commands) and stale.kernel_facts == first.kernel_facts
    record_build(obj, obj.with_suffix(".facts.json"), first.kernel_facts)  # its process rewrote the record too
    commands.clear()
    with pytest.raises(Refused, match="system"):
        CudaBackend(Device.CPU, None, 600).prepare(lent_to("third"), tmp_path / "third")
    assert commands == []  # refused before any link
