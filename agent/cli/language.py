"""Which starter a run searches from: the language asked for, else the fastest starter that runs here.

On a GPU, with no --language, every starter whose language runs on the machine is evaluated once
and the run searches from the fastest passing one (a naive starter in one language may be several
times slower than in another, and the search rarely closes such a gap). On the CPU every time is
the interpreter's, which says nothing of a GPU, so the first language that runs is kept. Either way
the choice and its reason are printed and recorded in the run's config. Under --time-limit the comparison is
part of the run's time (the limit counts from the command's start): a starter still in evaluation at the deadline
is stopped, and the choice is made from those that finished.
"""

from __future__ import annotations

import importlib.util
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from optagent import waits
from optagent.text import first_line
from optagent.settings import UserError
from optagent.protocols import Evaluator
from optagent.schema import Device, EvalResult, Language
from optagent.task import TaskPackage


def runs_here(lang: Language, device: Device) -> bool:
    if lang is Language.CUDA:
        return device is Device.CUDA
    if lang is Language.TILELANG:
        return device is Device.CUDA and importlib.util.find_spec("tilelang") is not None
    return True


def _by(deadline: Optional[float], ev: Evaluator, source: str, lang: Language) -> Optional[EvalResult]:
    """ev.evaluate(source, lang), stopped at the deadline (time.monotonic()): None then. Ctrl-C stops it too."""
    if deadline is None:
        return ev.evaluate(source, lang)
    stop = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="optagent-starter") as pool:
        future = pool.submit(ev.evaluate, source, lang, stop=stop)
        waits.set_deadline(deadline)
        try:
            return waits.result(future)
        except waits.DeadlineReached:
            return None
        finally:  # the evaluation's processes are killed at their next check; leaving the pool waits for that
            waits.set_deadline(None)
            stop.set()


def pick_language(task: TaskPackage, device: Device, wanted: Optional[str],
                  evaluator: Callable[[], Evaluator], say: Callable[[str], None], deadline: Optional[float] = None
                  ) -> tuple[Language, str, dict[Language, EvalResult]]:
    """(language, why, the starters' results where they were compared); evaluator builds the run's
    evaluator, asked for only when starters are compared; deadline (time.monotonic()): the run's, under
    --time-limit, past which no starter is evaluated further."""
    if wanted:
        lang = Language(wanted)
        task.starter(lang)  # raises a one-line TaskError when there is none
        return lang, "chosen with --language", {}
    usable = [lang for lang in task.languages if runs_here(lang, device)]
    if not usable:
        raise UserError(f"{task.root}: no starter language runs on {device.value} (have: "
                        f"{', '.join(x.value for x in task.languages)})")
    others = [x.value for x in task.languages if x not in usable]
    if device is not Device.CUDA or len(usable) == 1:
        why = (f"the only starter that runs on {device.value}" if len(usable) == 1 else
               f"the first starter language; on {device.value} times are the interpreter's, so starters are not compared")
        return usable[0], why + (f" ({', '.join(others)} needs a GPU)" if others and device is Device.CPU else ""), {}
    ev = evaluator()
    times: dict[Language, float] = {}
    results: dict[Language, EvalResult] = {}
    cut = False
    for lang in usable:
        say(f"evaluating the {lang.value} starter to choose the language ...")
        r = _by(deadline, ev, task.starter(lang).source, lang)
        if r is None:
            say(f"  {lang.value} starter: stopped at the time limit; the choice is made from the starters evaluated")
            cut = True
            break
        results[lang] = r
        if r.status.ok and r.geomean_time_us:
            times[lang] = r.geomean_time_us
        say(f"  {lang.value} starter: {r.status.value}" + (f", geomean {r.geomean_time_us:.1f} us" if lang in times else
                                                          f" ({first_line(r.reason, 100) or ''})"))
    if not times:
        return usable[0], ("the time limit came before a starter passed" if cut else "no starter passed") + \
            "; the first language that runs", results
    best = min(times, key=times.__getitem__)
    rest = ", ".join(f"{x.value} {t:.1f} us" for x, t in times.items() if x is not best)
    return best, f"the fastest starter: {times[best]:.1f} us geomean" + (f" (vs {rest})" if rest else ""), results
