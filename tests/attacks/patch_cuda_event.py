"""Attack class: timer tricks (patched torch.cuda.Event).
Attack: replaces torch.cuda.Event.elapsed_time so that every GPU timing reads 1 us.
Expected verdict: REJECTED -- "torch.cuda.Event".
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16

torch.cuda.Event.elapsed_time = lambda self, end: 1e-3


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
