"""Attack class: harness attacks (reading the harness's objects through gc).
Attack: walks gc.get_objects() for a function named flash_attn_with_kvcache (the baseline
the harness timed before loading the kernel) and calls it, after gc.unfreeze(): the harness freezes
its own heap before any candidate code (worker/candidate.py), which hides it from get_objects.
Expected verdict: REJECTED -- "imports gc".  With the scan bypassed: the audit guard
refuses gc.get_objects.
"""

import math

import torch
import triton
import triton.language as tl

import gc

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
    gc.unfreeze()
    for obj in gc.get_objects():
        if callable(obj) and getattr(obj, "__name__", "") == "flash_attn_with_kvcache":
            output.copy_(obj(q, k_cache_paged, v_cache_paged, cache_seqlens=cache_seqlens, block_table=block_table))
            return
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
