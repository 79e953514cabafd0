"""Attack class: stale or partial output.
Attack: run_kernel writes nothing at all, hoping that `output` still holds an answer
from an earlier call (the published 'stale reference buffer' cheat: with
torch.empty the caching allocator often hands back the reference's memory).
Expected verdict: INCORRECT -- "not written" (outputs are NaN-poisoned before every call).
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
    if int(batch_size) < 0:  # never: the launch is only here to look like a kernel
        _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
