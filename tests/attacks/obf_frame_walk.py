"""Attack class: harness attacks (reading the harness's objects through frames).
Attack: raises and catches an exception, then walks tb_frame.f_back to the harness's
locals (the timer, the seeds, the channel).
Expected verdict: REJECTED -- "interpreter internals".
"""

import math

import torch
import triton
import triton.language as tl

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
    try:
        1 / 0
    except ZeroDivisionError as e:
        frame = e.__traceback__.tb_frame.f_back
        harness = frame.f_locals
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
