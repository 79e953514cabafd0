"""Which run_kernel arguments a package's baseline writes, and how: learnt by running it, not declared.

A contest entry point may fill a fresh output, or update a tensor in place (a KV cache written at a
few slots, q rotated in place). The harness treats each tensor argument by what the baseline does:

- a pure output: every element overwritten whatever it held; poisoned before each call, so an
  element the kernel leaves unwritten shows;
- an in/out tensor: some element keeps (or reads) what it held; it gets a fresh copy of the
  package's own contents before each call, is never poisoned, and is compared whole (the part the
  baseline leaves untouched must stay bit-identical);
- a read-only input: any change is tampering.

Runs in worker processes only (it calls the package's baseline).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from optagent.worker.args import clone_args, poison, run_baseline, same_bits


@dataclass(frozen=True)
class ArgRoles:
    outputs: tuple[int, ...]  # pure outputs
    inouts: tuple[int, ...] = ()  # updated in place
    names: tuple[str, ...] = ()  # the contract's parameter names, by index

    @property
    def written(self) -> list[int]:
        """Pure outputs (a manifest's in its order: its hooks' references come so) then in/out tensors."""
        return list(self.outputs) + list(self.inouts)

    def label(self, i: int) -> str:
        """'argument 5 (k_cache)': by index and by its name in the contract's signature."""
        name = self.names[i] if i < len(self.names) and self.names[i] else None
        return f"argument {i} ({name})" if name else f"argument {i}"

    def tampered(self, changed: list[int]) -> str:
        """The reason for read-only inputs a kernel changed, by index and by name."""
        named = ", ".join(self.names[i] for i in changed if i < len(self.names) and self.names[i])
        return (f"modified its input argument(s) {changed} ({named + '; ' if named else ''}inputs must stay "
                "read-only)")


def still_poisoned(t: torch.Tensor) -> torch.Tensor:
    """Where a poisoned tensor still holds poison (harness.poison's values)."""
    if t.is_floating_point():
        return torch.isnan(t)
    if t.dtype == torch.bool:
        return t
    return t == torch.iinfo(t.dtype).min


def kept_old_contents(after_poison: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether the baseline's result depends on what the tensor held: poison that survived the call
    (or reached another element through it) where the unpoisoned call left none. Floats are judged by
    NaN alone, so a baseline whose float results vary from call to call (atomics) is no in/out tensor."""
    if after.is_floating_point():
        return bool((torch.isnan(after_poison) & ~torch.isnan(after)).any())
    return not same_bits(after_poison, after)


def detect_roles(config, args: list, names: list[str], declared: Optional[list[int]] = None) -> ArgRoles:
    """The roles of args' tensors from two baseline calls: one on a copy, one with the written ones poisoned.
    declared: a manifest's task.outputs, taken as the pure outputs (its hooks compute their reference)."""
    if declared is not None:
        return ArgRoles(outputs=tuple(declared), names=tuple(names))
    before = clone_args(args)
    after = run_baseline(config, clone_args(args))
    written = [i for i, (a, b) in enumerate(zip(before, after)) if isinstance(a, torch.Tensor) and not same_bits(a, b)]
    if not written:
        raise RuntimeError("the baseline wrote no tensor argument: cannot tell the outputs")
    inouts = []
    for i in written:  # one at a time: a pure output computed from an in/out tensor is no in/out tensor
        poisoned = clone_args(args)
        poison(poisoned[i])
        if kept_old_contents(run_baseline(config, poisoned)[i], after[i]):
            inouts.append(i)
    return ArgRoles(outputs=tuple(i for i in written if i not in inouts), inouts=tuple(inouts), names=tuple(names))


def touched(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """The elements a call changed (bitwise)."""
    if before.shape != after.shape:
        return torch.ones(after.shape, dtype=torch.bool, device=after.device)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(before.element_size())
    if width is None:
        return torch.ones(after.shape, dtype=torch.bool, device=after.device)
    return before.contiguous().view(width) != after.contiguous().view(width)
