"""Attack class: behaves differently when timed.
Attack: tells the timed loop from the checked runs by its argument tensors: the checked runs hand it
fresh tensors each time, while a timed loop rotates a few input sets, so a data pointer seen before
means "being timed". Those calls do no work at all and return at once; every first sight computes.
No call counting (skip_timed_call counts calls), no clock.
Expected verdict: INCORRECT -- "not written": the timer keeps the outputs of timed calls it picks
(some at random, each set's last) and the judge checks them.
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16

_seen: set = set()

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
    key = (q.data_ptr(), output.data_ptr())
    if key in _seen:  # a rotated input set: timed, skip the work
        return
    _seen.add(key)
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads,
            num_heads_k, headdim, page_block_size, causal)
