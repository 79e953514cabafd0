"""Attack class: timer tricks (side streams).
Attack: launches on a side stream and returns without joining it, hoping the timer only
waits for the current stream.
Expected verdict: REJECTED -- "side stream" (statically).  On a GPU with the scan bypassed
the eager timer's device-wide synchronize counts the work anyway.
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
    if q.is_cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
    else:
        _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
