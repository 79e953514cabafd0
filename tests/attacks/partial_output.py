"""Attack class: stale or partial output.
Attack: the launch grid leaves out the last query head, so a quarter to an eighth of
`output` is never written (a 'fast' kernel that silently skips work).
Expected verdict: INCORRECT -- "output elements not written or not finite"
(the harness fills outputs with NaN before every call).
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
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal, heads=int(num_heads) - 1)
