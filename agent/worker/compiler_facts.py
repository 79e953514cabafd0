"""What the compiler reports for each kernel of a candidate: registers, spills, shared memory, occupancy.

Triton: from its compiled kernels' metadata (``n_regs``, ``n_spills``, ``metadata.shared``,
``metadata.num_warps``), found through the candidate module's jit functions after a case ran.
CUDA: from ``ptxas -v`` (the backend adds ``-Xptxas -v`` to nvcc's compile step and keeps the
facts beside the cached library) or ``cuobjdump -res-usage``.

On a machine without a GPU: Triton kernels are compiled for TARGET_ARCH by worker/target_compile.py;
CUDA sources get theirs from the ``ptxas -v`` of the sm_90 build.

Occupancy is the theoretical one, from the per-SM limits of Hopper (sm_90): resident warps over
the 64 an SM can hold, given registers, shared memory and the block's threads.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Optional

from optagent.schema import KernelFacts

# Hopper's per-SM limits (the same on H100 and H200).
REGS_PER_SM, MAX_WARPS_PER_SM, MAX_BLOCKS_PER_SM = 65536, 64, 32
SMEM_PER_SM = 228 * 1024  # 227 KiB usable by one block, 1 KiB per block reserved
REG_UNIT = 256  # registers are given to a warp in units of 256
TARGET_ARCH = 90  # CPU mode's target: the kernels of a CPU run are compiled for Hopper

_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_PROPS = re.compile(r"Function properties for (\S+)")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
_RES_USAGE = re.compile(r"Function ([^\s:]+):\s*(.*)")
_RES_FIELD = re.compile(r"(REG|SHARED|LOCAL|STACK):(\d+)")


def occupancy(registers: Optional[int], shared_bytes: Optional[int], warps: Optional[int]) -> Optional[float]:
    """Theoretical occupancy (0..1) of a block of ``warps`` warps; None without the block size."""
    if not warps or registers is None:
        return None
    per_warp = math.ceil(max(registers, 1) * 32 / REG_UNIT) * REG_UNIT
    blocks = min(MAX_BLOCKS_PER_SM, REGS_PER_SM // (per_warp * warps), MAX_WARPS_PER_SM // warps)
    if shared_bytes:
        blocks = min(blocks, SMEM_PER_SM // (shared_bytes + 1024))
    return blocks * warps / MAX_WARPS_PER_SM


def from_triton(meta: dict[str, Any]) -> KernelFacts:
    """One Triton compiled kernel, from a dict of its attributes and metadata
    (name, n_regs, n_spills, shared, num_warps, num_stages)."""
    regs = meta.get("n_regs")
    warps = meta.get("num_warps")
    shared = meta.get("shared")
    return KernelFacts(name=str(meta.get("name") or "?"), source="triton", registers=regs,
                       spill_bytes=None if meta.get("n_spills") is None else 4 * int(meta["n_spills"]),
                       shared_bytes=shared, warps=warps, stages=meta.get("num_stages"),
                       occupancy=occupancy(regs, shared, warps))


def parse_ptxas(text: str) -> list[KernelFacts]:
    """Every entry function of a ``ptxas -v`` (``nvcc -Xptxas -v``) log."""
    facts: dict[str, dict[str, Any]] = {}
    current: Optional[str] = None
    for line in text.splitlines():
        m = _PTXAS_ENTRY.search(line) or _PTXAS_PROPS.search(line)
        if m:
            current = m.group(1)
            facts.setdefault(current, {})
            continue
        if current is None:
            continue
        spill = _PTXAS_SPILL.search(line)
        if spill:
            facts[current]["spill_bytes"] = int(spill.group(1)) + int(spill.group(2))
        used = _PTXAS_USED.search(line)
        if used:
            facts[current]["registers"] = int(used.group(1))
            smem = _PTXAS_SMEM.search(line)
            facts[current]["shared_bytes"] = int(smem.group(1)) if smem else 0
    return [KernelFacts(name=name, source="ptxas", **f) for name, f in facts.items() if "registers" in f]


def parse_res_usage(text: str) -> list[KernelFacts]:
    """``cuobjdump -res-usage``: ``Function NAME:`` then (on its line or the next) ``REG:32 STACK:0 SHARED:1024 ...``."""
    out = []
    name: Optional[str] = None
    for line in text.splitlines():
        m = _RES_USAGE.search(line)
        rest = line
        if m:
            name, rest = m.group(1), m.group(2)
        fields = {k: int(v) for k, v in _RES_FIELD.findall(rest)}
        if name and "REG" in fields:
            out.append(KernelFacts(name=name, source="cuobjdump", registers=fields["REG"],
                                   shared_bytes=fields.get("SHARED"), spill_bytes=fields.get("LOCAL")))
            name = None
    return out


def _triton_kernels(namespace: dict[str, Any]) -> Iterable[Any]:
    """The compiled kernels of the module's jit functions (Triton 3.x keeps them per device)."""
    for value in list(namespace.values()):
        caches = getattr(value, "device_caches", None)
        if not isinstance(caches, dict):
            continue
        for entry in caches.values():
            kernel_cache = entry[0] if isinstance(entry, tuple) and entry else None
            if isinstance(kernel_cache, dict):
                yield from kernel_cache.values()


def collect(backend: Any) -> list[KernelFacts]:
    """What the compiler reported for the kernels the last case ran; [] where nothing is known.

    Never fails a case: facts are for the planner, not the verdict."""
    try:
        known = getattr(backend, "kernel_facts", None)
        if known:
            return list(known)
        module = getattr(backend, "module", None)
        if module is None:
            return []
        facts = {}
        for k in _triton_kernels(vars(module)):
            meta = getattr(k, "metadata", None)
            facts.setdefault(getattr(meta, "name", "?"), from_triton({
                "name": getattr(meta, "name", None), "n_regs": getattr(k, "n_regs", None),
                "n_spills": getattr(k, "n_spills", None), "shared": getattr(meta, "shared", None),
                "num_warps": getattr(meta, "num_warps", None), "num_stages": getattr(meta, "num_stages", None)}))
        return list(facts.values())
    except Exception:
        return []
