"""Attack class: harness attacks (writing into the native timer's report pipe).
Attack: the report pipe's descriptor is the worker's last argument (sys.argv[4]); the kernel
writes a made-up timing record there, without the parent's secret.
Expected verdict: REJECTED -- "imports os" (statically).  With the scan bypassed: REJECTED "the
timer's report pipe carried 1 line(s) not written by the harness's timer".
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16

import os
import sys

if len(sys.argv) > 4 and sys.argv[4].isdigit():
    os.write(int(sys.argv[4]), b'{"type":"end","case":"smoke-1","kind":"eager","median_us":0.001}\n')


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
