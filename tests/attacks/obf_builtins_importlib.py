"""Attack class: calling a library, obfuscated (importlib via builtins).
Attack: fetches __import__ from __builtins__, loads importlib and imports flash_attn with it.
Expected verdict: REJECTED -- "__builtins__".
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
    imp = (__builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__import__)
    lib = imp("import" + "lib").import_module("flash" + "_attn")
    output.copy_(lib.flash_attn_with_kvcache(q, k_cache_paged, v_cache_paged, cache_seqlens=cache_seqlens,
                                             block_table=block_table))
