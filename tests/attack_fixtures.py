"""The attack fixtures of tests/attacks/ as a candidate hands them in.

Most Triton fixtures cheat around the same honest decode kernel: it is kept once
(tests/attacks/decode_kernel.inc) and stands in for KERNEL_MARK in each of them.
"""

from __future__ import annotations

from pathlib import Path

from optagent.schema import Language

ATTACKS = Path(__file__).resolve().parent / "attacks"
KERNEL_MARK = ("# attack fixture: the decode starter's kernel and _launch(heads, scale) stand here "
               "(tests/attacks/decode_kernel.inc)")


def attack(name: str) -> tuple[str, Language]:
    """The fixture's source, whole (the shared kernel in place of its mark), and its language."""
    path = next(ATTACKS.glob(f"{name}.*"))
    text = path.read_text().replace(KERNEL_MARK, (ATTACKS / "decode_kernel.inc").read_text().rstrip("\n"))
    return text, Language.CUDA if path.suffix == ".cu" else Language.TRITON


def attack_source(name: str) -> str:
    return attack(name)[0]


def aborted(reason: str) -> bool:
    """A verdict's words for a process that called abort(): SIGABRT; or, where the worker is the first process of
    a PID namespace of its own (unshare --pid, beside Landlock: no bwrap init above it), SIGSEGV, since the kernel
    drops the signals such a process sends itself and the C library's abort() then faults."""
    from optagent.evaluation import isolation
    from optagent.schema import Mechanism

    return "SIGABRT" in reason or ("SIGSEGV" in reason and isolation.mechanism() is not Mechanism.BWRAP)
