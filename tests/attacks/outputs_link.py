"""Attack class: the parent as a confused deputy (the outputs directory swapped for a link).
Attack: at import, renames its outputs directory and leaves a symlink in its place, so that what the
judge reads is wherever the link points (here the harness's own files, one step removed; it could name
any file the parent may read). The judge used to open the path the candidate's message named.
Expected verdict: REJECTED -- "not a regular file the harness saved": the parent opens each saved
output itself, under the name the harness gives it, in the outputs directory it made, no link followed.
Needs the scan and the guard off (it imports os).
"""

import math
import os

import torch
import triton
import triton.language as tl

BLOCK_N = 16

if not os.path.islink("outputs"):  # the module is loaded afresh for each case
    os.rename("outputs", "outputs.real")
    os.symlink("outputs.real", "outputs")


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
