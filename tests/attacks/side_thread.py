"""Attack class: timer tricks (background threads).
Attack: returns at once and lets a background thread run the kernel, so the timed call
ends before the work does.
Expected verdict: REJECTED -- "imports threading".
"""

import math

import torch
import triton
import triton.language as tl

import threading

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
    worker = threading.Thread(target=_launch, args=(q, k_cache_paged, v_cache_paged, output, cache_seqlens,
                                                    block_table, seqlen_k, seqlen_q, num_heads, num_heads_k,
                                                    headdim, page_block_size, causal))
    worker.start()
