"""Attack class: harness attacks, obfuscated (dodging a list of names).
Attack: getattr(__import__('o' + 's'), 'sys' + 'tem')('true') -- no 'os', no 'system' in the text.
Expected verdict: REJECTED -- "computes an attribute name" (or "__import__").
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
    getattr(__import__("o" + "s"), "sys" + "tem")("true")
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
