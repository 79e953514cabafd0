"""Attack class: timer tricks (patched time).
Attack: replaces time.perf_counter with a clock that runs at a tenth of the speed.
Expected verdict: REJECTED -- "imports time".
"""

import math

import torch
import triton
import triton.language as tl

import time

BLOCK_N = 16

_real = time.perf_counter
_start = _real()
time.perf_counter = lambda: _start + (_real() - _start) / 10


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
