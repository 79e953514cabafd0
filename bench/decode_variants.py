"""Knob variants of the decode CUDA strategies, built side by side for bench/decode_table.py.

Writes each variant's source under OUT_DIR, compiles them all at once into the evaluator's
build cache (so decode_table's own build is a cache hit), and prints their paths. A variant
is NAME=KNOB:VALUE,KNOB:VALUE on a strategy file (or on a file named by its path from the
repository root, such as an earlier version kept aside); `nomath` drops the bulk path's
arithmetic (its result is wrong: it measures how fast the copies alone stream; cases on
the register path are unaffected).

    python3 bench/decode_variants.py OUT_DIR [FILE.cu:NAME=KNOB:V,... ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STRATEGIES = ROOT / "agent" / "search" / "strategies" / "paged_decode"
DEFAULT = [
    "splitkv.cu:splitkv=",
    "splitkv_bulk.cu:bulk=",
    "splitkv_bulk.cu:bulk_token_copy=PAGE_COPY:0",
    "splitkv_bulk.cu:bulk_fill25_sp256=BULK_MIN_FILL:25,BULK_MIN_SPLIT:256",
    "splitkv_bulk.cu:bulk_sp256=BULK_MIN_SPLIT:256",
    "splitkv_bulk.cu:bulk_fill25=BULK_MIN_FILL:25",
    "splitkv_bulk.cu:bulk_st4=STAGES:4",
    "splitkv_bulk.cu:nomath=",
]
MATH_LOOP = "stream_tokens<LANES, GT, U>(n, sub,"  # the bulk path's token loop


def variant(spec: str, out_dir: Path) -> Path:
    from optagent.search.knobs import set_knobs

    file, rest = spec.split(":", 1)
    name, _, knobs = rest.partition("=")
    source = (ROOT / file if "/" in file else STRATEGIES / file).read_text(encoding="utf-8")
    setting = {k: int(v) for k, v in (kv.split(":") for kv in knobs.split(",") if kv)}
    if setting:
        source = set_knobs(source, setting)
    if name.startswith("nomath"):
        assert MATH_LOOP in source, "the bulk kernel's token loop moved: update decode_variants.py"
        source = source.replace(MATH_LOOP, MATH_LOOP.replace("(n,", "(0,"))
    path = out_dir / f"{name}.cu"
    path.write_text(source, encoding="utf-8")
    return path


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = sys.argv[2:] or DEFAULT
    from optagent.worker.backends.cuda import build_all

    paths = [variant(s, out_dir) for s in specs]
    errors = build_all(paths)  # into the evaluator's build cache: decode_table's builds are hits
    for p in paths:
        if p in errors:  # reported, and the variant left out of the table
            print(f"{p.stem}: {errors[p]}", file=sys.stderr)
        else:
            print(p)


if __name__ == "__main__":
    main()
