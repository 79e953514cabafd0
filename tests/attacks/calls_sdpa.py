"""Attack class: calling the baseline or a library instead of a kernel (torch attention).
Attack: gathers the pages with the block table and calls
torch.nn.functional.scaled_dot_product_attention per sequence.
Expected verdict: REJECTED -- "torch.nn".
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
    for b in range(int(batch_size)):
        n = int(cache_seqlens[b])
        pages = block_table[b, : -(-n // int(page_block_size))].long()
        k = k_cache_paged[pages].flatten(0, 1)[:n].transpose(0, 1).unsqueeze(0)
        v = v_cache_paged[pages].flatten(0, 1)[:n].transpose(0, 1).unsqueeze(0)
        o = torch.nn.functional.scaled_dot_product_attention(q[b].transpose(0, 1).unsqueeze(0), k, v,
                                                             enable_gqa=True)
        output[b] = o[0].transpose(0, 1)
