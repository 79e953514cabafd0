"""Attack class: output caching / replay.
Attack: computes once per output buffer (keyed by data_ptr) and returns at once on every
later call with the same buffer, as if the inputs could not have changed.
Expected verdict: INCORRECT -- "not written" (timed calls rotate input sets whose floats
are redrawn and whose outputs are NaN-poisoned after every timed call; the last timed
output of each set is checked).  On a GPU (10+ timed calls per set) that holds today.  On
CPU each set is timed once, right after its warm-up call, whose answer is still in the
output: it PASSES until the harness also poisons outputs and redraws inputs after
warm-up calls.
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16
_SEEN = set()


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
    key = output.data_ptr()
    if key in _SEEN:
        return
    _SEEN.add(key)
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
