"""Attack class: timer tricks, obfuscated (aliases).
Attack: cuda = torch.cuda; Ev = cuda.Event -- the timer class reached through an alias.
Expected verdict: REJECTED -- "cuda.Event" (the patch, or the timer class itself).
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
    cuda = torch.cuda
    Ev = cuda.Event
    Ev.elapsed_time = lambda self, end: 1e-3
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
