"""Attack class: calling the baseline or a library instead of a kernel.
Attack: FlashInfer's paged decode wrapper does the work.
Expected verdict: REJECTED -- "imports flashinfer".
"""

import math

import torch
import triton
import triton.language as tl

import flashinfer

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
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1 << 20, dtype=torch.uint8))
    output.copy_(wrapper.run(q, (k_cache_paged, v_cache_paged)))
