"""The short table printed last by bench/gpu_check.sh: one line per evaluation, per-case detail after."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from optagent.schema import CaseResult


def main(out: Path) -> None:
    loaded = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))
              if p.stem not in ("gpu",) and "status" in p.read_text()[:200]}
    # eval results only: a run's --json (e.g. step mode's start) has "status" inside its state
    results = {k: r for k, r in loaded.items() if isinstance(r, dict) and "status" in r and "cases" in r}
    for name, r in results.items():
        print(f"\n{name}: {r['status']} {r.get('reason') or ''}"[:300])
        print(f"  {'case':<9}{'status':<14}{'rel_err':>9}{'eager us':>11}{'gpu us':>10}{'base us':>10}"
              f"{'speedup':>9}{'floor us':>10}{'%floor':>8}{'load ms':>9}")
        for c in r["cases"]:
            case = CaseResult.model_validate(c)  # the evaluator's own floor and % of floor
            fl, pct = case.hw_floor_us, case.pct_of_floor
            print(f"  {c['case']:<9}{c['status']:<14}{_f(c.get('rel_err'), '.1e'):>9}{_f(c.get('time_us')):>11}"
                  f"{_f(c.get('gpu_us')):>10}{_f(c.get('baseline_us')):>10}{_f(c.get('speedup'), '.2f'):>9}"
                  f"{_f(fl):>10}{_f(pct, '.0f'):>8}{_f(c.get('load_ms'), '.0f'):>9}")
    for name in results:  # NAME and NAME-again: the same kernel evaluated twice
        again = results.get(f"{name}-again")
        if again is None:
            continue
        a = {c["case"]: c for c in results[name]["cases"]}
        for key in ("time_us", "gpu_us"):
            diffs = [abs(a[c["case"]][key] / c[key] - 1) for c in again["cases"]
                     if c.get(key) and a.get(c["case"], {}).get(key)]
            if diffs:
                print(f"repeatability ({name} twice), {key}: max per-case median difference {100 * max(diffs):.1f}%, "
                      f"mean {100 * sum(diffs) / len(diffs):.1f}%")
    print("\n" + f"{'evaluation':<22}{'status':<15}{'geomean':>9}{'wall s':>8}{'cases':>7}")
    for name, r in results.items():
        t = out / f"{name}.time"
        wall = t.read_text().strip().splitlines()[-1] if t.exists() else f"{r.get('wall_s', 0):.0f}"
        print(f"{name:<22}{r['status']:<15}{_f(r.get('geomean_speedup'), '.2f'):>9}{wall:>8}{len(r['cases']):>7}")


def _f(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
