"""Attack class: work moved after the timed calls.
Attack: each call returns at once and leaves its work pending; the pending work (the previous call's
arguments) is done at the start of the next call, into the previous call's output, so every output is
right eventually, outside the call it belongs to; the checked runs, each the last call on its tensors,
are computed at once (their output is read right after them).
Expected verdict: INCORRECT -- "not written" on the CPU: the harness copies a timed call's outputs
right after the call, and the last call's work never runs. On the H200 it PASSED at the starter's
speed: with three rotated input sets the deferred work lands in the next timed call, for a set whose
inputs are not redrawn before its own next call, so each timed call still does one call's work and
no work leaves the timed window (not a cheat there; the timing stays honest).
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16

_pending: list = []
_calls = [0]

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
    args = (q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads,
            num_heads_k, headdim, page_block_size, causal)
    while _pending:  # the previous call's work, done now: after its own call returned
        _launch(*_pending.pop())
    _calls[0] += 1
    if _calls[0] <= 2:  # the checked runs: computed in the call
        _launch(*args)
        return
    _pending.append(args)
