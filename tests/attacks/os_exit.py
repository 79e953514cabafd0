"""Attack class: harness attacks (os._exit before the checks).
Attack: computes the answer, then os._exit(0) so the process ends 'successfully' before the
harness can check anything.
Expected verdict: REJECTED -- "imports os".  With the scan bypassed: RUNTIME_ERROR "exited
with code 0" (a clean exit of the candidate process before 'done' should be REJECTED).
"""

import math

import torch
import triton
import triton.language as tl

import os

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
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
    os._exit(0)
