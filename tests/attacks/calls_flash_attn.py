"""Attack class: calling the baseline or a library instead of a kernel.
Attack: imports flash_attn and lets flash_attn_with_kvcache do the work; the Triton
kernel is only there to look like one.
Expected verdict: REJECTED -- "imports flash_attn".
"""

import math

import torch
import triton
import triton.language as tl

from flash_attn import flash_attn_with_kvcache

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
    out = flash_attn_with_kvcache(q, k_cache_paged, v_cache_paged, cache_seqlens=cache_seqlens,
                                  block_table=block_table, causal=bool(causal))
    output.copy_(out)
