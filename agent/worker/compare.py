"""The judge's own comparison of a written argument with the reference, before the package's check().

Floats: an element left unwritten (still poison) or not finite where the reference is finite.
In/out tensors: every element the baseline leaves untouched must come back bit-identical.
Integers: compared exactly; where the package has a check() it stays the authority (its tie rule
may accept another order than its baseline's), and the mismatch only explains its failure.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from typing import Optional

import torch

from optagent.worker.arg_roles import ArgRoles, still_poisoned, touched
from optagent.worker.args import clone_args, run_baseline


def marker(t: torch.Tensor) -> torch.Tensor:
    """t filled with a value a computation is unlikely to produce: where it survives a call, that call
    left the element alone (a NaN would survive a read-modify-write too)."""
    out = torch.empty_like(t)
    if t.is_floating_point():
        return out.fill_(-7.7e3 if t.element_size() >= 2 else -96.0)
    return out.fill_(torch.iinfo(t.dtype).max - 12345 if t.element_size() > 1 else 77)


def untouched_masks(config, args: list, base: list, roles: ArgRoles) -> dict[int, torch.Tensor]:
    """Per in/out tensor, the elements the baseline leaves alone: rows (along the last dimension)
    unchanged by its call on the inputs, and still holding the marker when the tensor held it instead."""
    masks = {}
    for i in roles.inouts:
        if args[i].dtype == torch.bool:
            continue
        same = ~touched(args[i], base[i])
        if not args[i].dim() or not bool(same.all(dim=-1).any()):
            continue  # the call changed every row: nothing left alone
        marked = clone_args(args)
        fill = marker(args[i])
        marked[i] = fill.clone()
        after = run_baseline(config, marked)[i]
        if after.shape == fill.shape:
            alone = same & ~touched(fill, after)
            # whole rows (the last dimension) only: an element of a row the call computes may come out
            # unchanged by chance (a small rotation in bf16), a row left alone is a slot never written
            masks[i] = alone.all(dim=-1, keepdim=True).expand_as(alone)
    return masks


def first_index(mask: torch.Tensor) -> int:
    return int(mask.flatten().nonzero()[0])


def written_problem(roles: ArgRoles, i: int, out: torch.Tensor, ref: torch.Tensor, original: torch.Tensor,
                    untouched: Optional[torch.Tensor], where: str) -> Optional[str]:
    """Why the kernel's written argument i is wrong whatever check() says, or None."""
    what = roles.label(i)
    if untouched is not None:
        changed = untouched & touched(original, out)
        if bool(changed.any()):
            return (f"{what}: {int(changed.sum())} of {int(untouched.sum())} elements the baseline leaves untouched "
                    f"were changed ({where}, first at flat index {first_index(changed)}); in/out tensors must keep "
                    "them bit-identical")
    if out.is_floating_point() or ref.is_floating_point():
        bad = ~torch.isfinite(out.double()) & torch.isfinite(ref.double())
        kind = "not written or not finite"
    elif i in roles.outputs:
        bad = still_poisoned(out) & ~still_poisoned(ref)
        kind = "not written"
    else:
        return None
    if bool(bad.any()):
        return (f"{int(bad.sum())} of {out.numel()} output elements {kind} in {what} ({where}, first at flat index "
                f"{first_index(bad)})")
    return None


def integer_mismatch(roles: ArgRoles, i: int, out: torch.Tensor, ref: torch.Tensor, where: str) -> Optional[str]:
    """An integer argument that differs from the reference anywhere (exact comparison), or None."""
    if out.is_floating_point() or ref.is_floating_point() or out.shape != ref.shape:
        return None
    differ = out != ref.to(out.dtype)
    if not bool(differ.any()):
        return None
    at = first_index(differ)
    return (f"{roles.label(i)}: {int(differ.sum())} of {out.numel()} {str(out.dtype).removeprefix('torch.')} "
            f"elements differ from the baseline's ({where}, first at flat index {at}: "
            f"{int(out.flatten()[at])}, expected {int(ref.flatten()[at])})")


def run_check(config, sizes, args: list, outputs: dict[int, torch.Tensor],
              base: Optional[list] = None) -> tuple[bool, str]:
    """The package's check() on a call's outputs for the inputs `args` (as they were before the call), asked as
    the contest asks it: (its answer, what it printed to stderr). base: the baseline's outputs, else made here."""
    target = clone_args(args)
    for i, out in outputs.items():
        target[i] = out
    printed = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(printed):
        base = base if base is not None else run_baseline(config, clone_args(args))
        ok = config.check(sizes, clone_args(args), target, base)
    return bool(ok), printed.getvalue()


def fails_check(config, sizes, before: list, after: list, outs: list[int]) -> bool:
    """The package's check() on one call's outputs, as the judge asks it, here run by the harness in the
    candidate's process to spare a kernel that is wrong its timing: True only when check() says no (an
    exception, or a kernel that rebinds check(), leaves it to the judge, which never trusts this)."""
    try:
        return not run_check(config, sizes, before, {i: after[i] for i in outs})[0]
    except Exception:
        return False
