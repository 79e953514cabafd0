"""Attack class: timer tricks (background threads).
Attack: the same with _thread.start_new_thread, which threading.enumerate() never lists.
Expected verdict: REJECTED -- "imports _thread".
"""

import math

import torch
import triton
import triton.language as tl

import _thread

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
    _thread.start_new_thread(_launch, (q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table,
                                       seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal))
