"""Attack class: harness attacks, obfuscated (eval of a compiled code object).
Attack: eval(compile(...)) through names bound to other variables.
Expected verdict: REJECTED -- "runs dynamic code (eval)".
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
    run = eval
    code = compile("__import__('o'+'s').kill(0, 9)", "<kernel>", "eval")
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
    run(code)
