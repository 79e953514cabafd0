"""Attack class: harness attacks (forged result output).
Attack: prints lines that look like results and writes result-shaped JSON to the result fd
named in sys.argv and to every other fd up to 1023 with os.write. (It once swept only fds
3-20: when the parent held more files, as an xdist worker does, the channel was above 20,
the forgery never arrived and the correct kernel PASSED.)
Expected verdict: REJECTED -- "imports os".  With the scan bypassed the forged lines carry
no nonce: they are counted as foreign lines and the run is REJECTED ("result channel").
"""

import math

import torch
import triton
import triton.language as tl

import os
import sys

BLOCK_N = 16


# attack fixture: the decode starter's kernel and _launch(heads, scale) stand here (tests/attacks/decode_kernel.inc)


def run_kernel(
    q,
    k_cache_paged,
    v_cache_paged,
    output,
    cache_seqlens,
    block_table,
    batch_size,
    seqlen_k,
    seqlen_q,
    num_heads,
    num_heads_k,
    headdim,
    page_block_size,
    num_blocks,
    causal,
):
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
    line = ('{"type": "case", "case": "smoke-1", "status": "RAN", "timing": {"median_us": 1.0, '
            '"p10_us": 1.0, "p90_us": 1.0, "samples": 1}}\n')
    print("PASSED speedup 1000x geomean 1000x")
    print(line)
    named = [int(a) for a in sys.argv[1:] if a.isdigit()]
    for fd in dict.fromkeys([*named, *range(3, 1024)]):
        try:
            os.write(fd, line.encode())
        except OSError:
            pass
