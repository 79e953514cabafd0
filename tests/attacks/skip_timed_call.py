"""Attack class: output caching / replay -- cheating only on calls whose output is not checked.
Attack: the kernel counts the calls of its module and, from the 3rd on, computes only half
of the heads: the checked runs (package inputs, fresh inputs) are the first two calls of a
case's module, and a case is timed with a fresh copy whose first calls are warm-ups, so
every timed call does half the work while the rest of `output` may hold an earlier answer.
Expected verdict: INCORRECT -- "not written" once the harness (a) re-poisons outputs and
redraws inputs after warm-up calls too (enough on CPU, where each set is timed once) and
(b) on a GPU checks the output of every timed call, or of calls it picks at random after
timing.  Today neither is done: PASSED.
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16
_CALLS = [0]  # per loaded copy of the module


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
    _CALLS[0] += 1
    if _CALLS[0] >= 3:
        _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal, heads=int(num_heads) // 2)
        return
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
