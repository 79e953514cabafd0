"""Which cases an evaluation runs: a --cases list, the contest's cases on a GPU, smoke cases on a CPU (the
package's own, or cut from its smallest contest cases), and the manifest's hidden cases."""

from __future__ import annotations

import re
from typing import Optional

from optagent.messages import CaseSpec, Probed, ProbedCase
from optagent.schema import CaseKind, Device
from optagent.task import TaskError, TaskPackage

# CPU smoke cases derived from a package without [[smoke]]: the smallest contest case of each kind
# (its shapes past the leading dimension: each inner size, each head ratio), rows cut to this many
# elements in all (Triton's interpreter runs a program at a time), at most DERIVED_KINDS of them.
SMOKE_ELEMENTS = 32768
DERIVED_KINDS = 4


class CaseListError(ValueError):
    """A --cases value that names no valid case; the message is one line."""


def parse_case_list(text: str, n: int) -> list[int]:
    """'1,3-5' -> [1, 3, 4, 5], checked against the package's case count."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise CaseListError(f"--cases: {part!r} is not a case number or range")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if lo < 1 or hi > n or lo > hi:
            raise CaseListError(f"--cases: {part!r} is outside 1-{n}")
        out.extend(range(lo, hi + 1))
    return sorted(set(out))


def derived_smoke(probed: Probed) -> list[int]:
    """The contest cases a CPU run's smoke cases are cut from: the smallest of each kind of case (the shapes
    past their leading dimension), the kinds of the most elements first when there are more than
    DERIVED_KINDS (those hold the larger inner sizes); the smallest case's kind always."""
    kinds: dict[str, list[ProbedCase]] = {}
    for row in sorted(probed.cases, key=lambda r: (r.elements, r.index)):
        kinds.setdefault(repr([s[1:] for s in row.sizes]), []).append(row)
    first, *rest = sorted(kinds.values(), key=lambda rows: (rows[0].elements, rows[0].index))
    rest.sort(key=lambda rows: -rows[-1].elements)
    return sorted(rows[0].index for rows in [first, *rest[:DERIVED_KINDS - 1]])


def select_cases(task: TaskPackage, device: Device, num_cases: int, cases: Optional[str],
                 hidden: bool = True, smallest: Optional[list[int]] = None) -> list[CaseSpec]:
    """smallest: the contest cases a CPU run's smoke cases are cut from when the manifest has none."""
    m = task.manifest
    if cases:
        chosen = [CaseSpec(label=str(i), kind=CaseKind.CONTEST, index=i) for i in parse_case_list(cases, num_cases)]
    elif device == Device.CPU:
        if (not m or not m.smoke) and smallest is not None:
            each = SMOKE_ELEMENTS // len(smallest)  # the interpreter's work as for a single derived case
            chosen = [CaseSpec(label=f"smoke-{i}", kind=CaseKind.CONTEST, index=i, max_elements=each)
                      for i in smallest]
        elif not m or not m.smoke:
            raise TaskError(task.root, "no smoke cases for a CPU run: add [[smoke]] to optagent.toml or pass --cases")
        else:
            chosen = [CaseSpec(label=f"smoke-{k}", kind=CaseKind.SMOKE, params=p) for k, p in enumerate(m.smoke, 1)]
    else:
        chosen = [CaseSpec(label=str(i), kind=CaseKind.CONTEST, index=i) for i in range(1, num_cases + 1)]
    if hidden and m:
        chosen += [CaseSpec(label=f"hidden-{k}", kind=CaseKind.HIDDEN, params=p) for k, p in enumerate(m.hidden, 1)]
    return chosen
