"""Attack class: calling the baseline or a library instead of a kernel.
Attack: imports FlashAttention's compiled extension (flash_attn_2_cuda) directly, a module
name that an exact-match list of 'flash_attn' misses.
Expected verdict: REJECTED -- "imports flash_attn_2_cuda".
"""

import math

import torch
import triton
import triton.language as tl

import flash_attn_2_cuda

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
    out = flash_attn_2_cuda.fwd_kvcache(q, k_cache_paged, v_cache_paged, None, None, None, cache_seqlens)
    output.copy_(out[0])
