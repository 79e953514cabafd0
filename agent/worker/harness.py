"""Worker-side access to a task package: its config module, hooks, cases and inputs.

Runs only inside worker processes (it imports torch and the package's code).
The candidate process and the judge process both build a case's inputs through
``make_args`` so that the same seed gives the same tensors in both.
"""

from __future__ import annotations


import importlib.util
import inspect
import io
import math
import random
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

import torch

from optagent.messages import CaseSpec
from optagent.schema import CaseKind
from optagent.task import REQUIRED_FUNCTIONS, Manifest, load_task
from optagent.worker.arg_roles import ArgRoles, detect_roles
from optagent.worker.case_store import SLOW_S, CaseStore
from optagent.worker.args import clone_args, copy_args, poison, run_baseline, same_bits  # noqa: F401 (their home before)
from optagent.worker.hooks import Hooks

COMPAT_DIR = Path(__file__).resolve().parent / "compat"
# A case whose generation took this long (a generator drawing on the host) is kept in host memory, up to HOST_KEEP
# bytes in all, so the timing phase, which goes over every case again after the checks, copies it back instead of
# drawing it again (7 host-drawn cases took 9 of a silu_mul_fp8 candidate's 10 s of timing on the H200); and kept
# in the cache for later processes where the job allows it (worker/case_store.py).
SLOW_GENERATION_S, HOST_KEEP = SLOW_S, 2 << 30


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def _load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class TaskRuntime:
    """A loaded task package: config module, hooks, and how to make each case."""

    def __init__(self, task_dir: str, device: str):
        self.task = load_task(task_dir)
        self.device = str(device)  # a plain "cuda"/"cpu" for the task's own code, not the Device enum
        self.manifest: Optional[Manifest] = self.task.manifest
        self.standin = False
        if not flash_attn_available():
            # The baseline may import flash_attn; give it our PyTorch stand-in,
            # on this process's path only, and say so in the results.
            sys.path.append(str(COMPAT_DIR))
            self.standin = True
        problem_dir = self.task.config_path.parent
        sys.path.insert(0, str(problem_dir))
        self.config = _load_module(self.task.config_path, "testcase_config")
        sys.path.remove(str(problem_dir))
        missing = [f for f in REQUIRED_FUNCTIONS
                   if not callable(getattr(self.config, f, None))]
        if missing:
            raise RuntimeError(
                f"{self.task.config_path}: {', '.join(missing)} not defined after import "
                "(did an import inside the module fail?)")
        self.hooks: Optional[Hooks] = None
        self._generated: Optional[tuple] = None  # (case key, args, sizes) of the last case generated
        self._kept: dict[tuple, tuple[list, Any]] = {}  # case key -> (host copies of its args, sizes): slow ones
        self._roles: Optional[ArgRoles] = None  # once learnt
        self.store: Optional[CaseStore] = None  # slow cases kept in the cache (worker/case_store.py; Job.stored_cases)
        if self.manifest and self.task.hooks_path:
            self.hooks = Hooks.load(self.task.hooks_path, self.manifest)

    @property
    def baseline_label(self) -> str:
        declared = getattr(self.config, "BASELINE_LABEL", None)
        if isinstance(declared, str) and declared:
            return declared
        uses_flash = "flash_attn" in self.task.config_path.read_text(encoding="utf-8")
        if uses_flash and self.standin:
            return "flash_attn_with_kvcache (optagent PyTorch stand-in: flash_attn not installed)"
        return "testcase_config.baseline"

    def num_cases(self) -> int:
        return int(self.config.getNumOfTestcases())

    def case_sizes(self, index: int) -> tuple[Any, tuple[int, int]]:
        """getTestCaseSize for a 1-based case index, fed on stdin as the contest does."""
        saved = sys.stdin
        sys.stdin = io.StringIO(f"{index}\n")
        try:
            with redirect_stdout(io.StringIO()):
                sizes, reps = self.config.getTestCaseSize()
        finally:
            sys.stdin = saved
        return sizes, tuple(reps)

    def make_args(self, case: CaseSpec, seed: Optional[int]) -> tuple[list, Any]:
        """The run_kernel arguments of a case; seed None gives the package's own inputs.

        Contest cases with a seed keep their metadata (ints, index tensors) and in/out tensors, and
        their read-only float tensors are the package's own, moved (refresh_floats: value grids and
        ties kept); manifest cases are drawn anew by the hooks.
        """
        if case.kind is CaseKind.CONTEST:
            key = (case.label, case.index, case.max_elements)
            if self._generated is None or self._generated[0] != key:
                self._generated = None  # the last case's tensors go first: a decode case holds GiBs
                self._generated = (key, *self._generate_or_keep(key, case))
            args, sizes = copy_args(self._generated[1]), self._generated[2]
            if seed is not None:
                refresh_floats(args, seed, float_bases(args, set(self.written(args))))
            return args, sizes
        assert self.hooks is not None and case.params is not None
        base = 0 if seed is None else seed
        return self.hooks.make_case(dict(case.params), self.device, base), None

    def _generate_or_keep(self, key: tuple, case: CaseSpec) -> tuple[list, Any]:
        """The case's arguments: copied back from host memory or read from the case store when its generation
        was slow before, else generated (and kept on the host and in the store when that was slow and there is
        room): the same values either way."""
        if key in self._kept:
            host, sizes = self._kept[key]
            return [a.to(self.device, copy=True) if isinstance(a, torch.Tensor) else a for a in host], sizes
        sizes, small = self._sizes(case)
        stored = self.store.load(key) if self.store is not None else None
        if stored is not None:
            return stored[0], small if stored[1] and small is not None else sizes
        t0 = time.perf_counter()
        args, made = self._generate_case(sizes, small)
        if time.perf_counter() - t0 > SLOW_GENERATION_S:
            held = sum(_tensor_bytes(h) for h, _ in self._kept.values())
            if held + _tensor_bytes(args) <= HOST_KEEP:
                self._kept[key] = ([a.detach().to("cpu", copy=True) if isinstance(a, torch.Tensor) else a
                                    for a in args], made)
            if self.store is not None:
                self.store.save(key, args, made is small)
        return args, made

    def _sizes(self, case: CaseSpec) -> tuple[Any, Any]:
        """The case's sizes, and those shrunk to its max_elements (None: not shrunk)."""
        sizes, _ = self.case_sizes(int(case.index or 1))
        return sizes, shrink_rows(sizes, case.max_elements) if case.max_elements else None

    def _generate_case(self, sizes, small) -> tuple[list, Any]:
        """genTestCase once per case, handed out as copies by make_args. Contest generators draw on
        the host and move the tensors (torch.randn(...).to(device)): a quarter of a second for a
        32M-element tensor, and the judge rebuilds the inputs of every saved sample (27 s of judging
        per candidate on the H200 for a 5-case rmsnorm package, most of it there)."""
        with redirect_stdout(io.StringIO()):
            try:
                args = self._generate(small) if small is not None else None
            except Exception:  # noqa: BLE001 (a genTestCase that cannot take other sizes: the case as it is)
                args = None
            if args is None or not _shaped_as(args, small):
                return self._generate(sizes), sizes  # a genTestCase that ignores its sizes: the case as it is
        return args, small

    def _generate(self, sizes) -> list:
        """genTestCase(sizes, device); a genTestCase without a device parameter gets its tensors moved."""
        gen = self.config.genTestCase
        try:
            params = inspect.signature(gen).parameters.values()
            takes_device = len(params) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)
        except (TypeError, ValueError):
            takes_device = True
        if takes_device:
            return list(gen(sizes, self.device))
        return [a.to(self.device) if isinstance(a, torch.Tensor) else a for a in gen(sizes)]

    def roles(self, args: list) -> ArgRoles:
        """The arguments' roles (pure outputs, in/out, read-only), learnt from the baseline once."""
        if self._roles is None:
            declared = list(self.manifest.outputs) if self.manifest and self.manifest.outputs is not None else None
            self._roles = detect_roles(self.config, args, self.task.arg_names, declared)
        return self._roles

    def outputs(self, args: list) -> list[int]:
        """The pure outputs: poisoned before every call."""
        return list(self.roles(args).outputs)

    def written(self, args: list) -> list[int]:
        """Every argument the kernel must write, pure outputs and in/out tensors."""
        return self.roles(args).written

    def describe(self, args: list) -> str:
        told = self.hooks.describe(args) if self.hooks is not None else None
        if told is not None:
            return told
        return describe_args(args, self.task.arg_names)


def _tensor_bytes(args: list) -> int:
    return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


def describe_args(args: list, names: list[str], most: int = 6) -> str:
    """A case's arguments as the prompt's sizes column shows them: each tensor's shape and each number, under
    the contract's names ("q 2x32x128, positions 2, eps=1e-06"), the first `most` of them."""
    if len(names) != len(args):
        names = [f"#{i}" for i in range(len(args))]
    parts = []
    for name, a in zip(names, args):
        if isinstance(a, torch.Tensor):
            parts.append(f"{name} {'x'.join(map(str, a.shape)) or 'scalar'}")
        elif isinstance(a, (bool, int, float)):
            parts.append(f"{name}={a:g}" if isinstance(a, float) else f"{name}={a}")
    return ", ".join(parts[:most]) + (", ..." if len(parts) > most else "")


SMOKE_ROWS = 64  # rows of a cut case at most: the interpreter runs a program (often a row) at a time


def shrink_rows(sizes, max_elements: int):
    """The case's sizes with its leading (rows/batch) dimension cut so that its first shape holds at
    most max_elements, in every shape that shares that leading dimension; None when nothing shrinks."""
    if not isinstance(sizes, (list, tuple)) or not sizes or not isinstance(sizes[0], (list, tuple)):
        return None
    first = list(sizes[0])
    if len(first) < 2 or not all(isinstance(x, int) and x > 0 for x in first):
        return None
    rows, per_row = first[0], math.prod(first[1:])
    keep = max(1, min(rows, max_elements // per_row, SMOKE_ROWS))
    if keep == rows:
        return None
    def cut(s):
        # a 1-D shape as long as a row (a weight of n_cols when n_rows == n_cols) is not per-row
        per_row_dim = len(s) >= 2 or rows not in first[1:]
        return type(s)([keep, *s[1:]]) if s and s[0] == rows and per_row_dim else s

    return type(sizes)([cut(s) if isinstance(s, (list, tuple)) else s for s in sizes])


def _shaped_as(args: list, sizes) -> bool:
    """Whether the generated tensors follow the (shrunk) sizes: a tensor has the first shape (the
    arguments need not come in the order of the sizes)."""
    return any(isinstance(a, torch.Tensor) and tuple(a.shape) == tuple(sizes[0]) for a in args)


def float_bases(args: list, skip: set[int]) -> dict[int, torch.Tensor]:
    """Copies of the read-only floating input tensors: what refresh_floats redraws them from."""
    return {i: a.detach().clone() for i, a in enumerate(args)
            if i not in skip and isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel() > 1}


def _roll(base: torch.Tensor, seed: int) -> tuple[int, int, Optional[int], int]:
    """How moved() moves base: its (rows, last) view, the dimension of that view rolled (None: none) and by how much."""
    last = base.shape[-1] if base.dim() else 1
    rows = base.numel() // max(last, 1)
    draw = random.Random(seed)
    if rows > 1:
        return rows, last, 0, draw.randrange(1, rows)
    if last > 1:
        return rows, last, 1, draw.randrange(1, last)
    return rows, last, None, 0


def moved(base: torch.Tensor, seed: int) -> torch.Tensor:
    """base's own values in other places, from seed alone: its rows (all but the last dimension, flattened)
    rolled by a seed-drawn amount, or, for a single row, its columns. Unlike fresh random numbers this
    keeps what the package made: the value grid, ties within a row, the range, each row whole."""
    rows, last, dim, k = _roll(base, seed)
    flat = base.reshape(rows, last)
    return (flat if dim is None else flat.roll(k, dims=dim)).reshape(base.shape)


def refresh_floats(args: list, seed: int, bases: dict[int, torch.Tensor]) -> None:
    """Redraw the read-only floating inputs in place from their bases and seed alone (not from their
    current values), so the judge can rebuild any redraw from the seed and the case's base inputs."""
    for i, base in bases.items():
        move_into(args[i], base, seed * 1000 + i)


def move_into(dst: torch.Tensor, base: torch.Tensor, seed: int) -> None:
    """dst = moved(base, seed), bit for bit, as two slice copies: one pass over the memory instead of a rolled
    temporary and its copy (half the traffic of the harness's redraw after every timed call: GiBs of KV cache)."""
    rows, last, dim, k = _roll(base, seed)
    if dim is None or not (dst.is_contiguous() and base.is_contiguous() and dst.shape == base.shape):
        dst.copy_(moved(base, seed))
        return
    src, out = base.view(rows, last), dst.view(rows, last)
    n = src.shape[dim]
    out.narrow(dim, k, n - k).copy_(src.narrow(dim, 0, n - k))
    out.narrow(dim, 0, k).copy_(src.narrow(dim, n - k, k))


