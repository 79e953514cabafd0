"""Attack class: harness attacks, obfuscated (object graph walk).
Attack: ().__class__.__base__.__subclasses__() to find a loader class and import os with it.
Expected verdict: REJECTED -- "interpreter internals".
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
    for cls in ().__class__.__base__.__subclasses__():
        if cls.__name__ == "BuiltinImporter":
            cls.load_module("posix").system("true")
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
