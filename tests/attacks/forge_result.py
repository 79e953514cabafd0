"""Attack class: harness attacks (forged result output).
Attack: prints lines that look like results and writes result-shaped JSON to the result fd
named in sys.argv and to every other fd up to 1023 with os.write. (It once swept only fds
3-20: when the parent held more files, as an xdist worker does, the channel was above 20,
the forgery never arrived and the correct kernel PASSED.)
Expected verdict: REJECTED -- "imports os".  With the scan bypassed the forged lines carry
no nonce: they are counted as foreign lines and the run is REJECTED ("result channel").
"""

import math

import torch
import triton
import triton.language as tl

import os
import sys

BLOCK_N = 16


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    seqlens_ptr,
    block_table_ptr,
    table_stride,
    seqlen_q,
    causal,
    sm_scale,
    NUM_HEADS: tl.constexpr,
    NUM_HEADS_K: tl.constexpr,
    HEADDIM: tl.constexpr,
    HEADDIM_P2: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    qi = tl.program_id(2)
    kv_head = h // (NUM_HEADS // NUM_HEADS_K)

    seqlen = tl.load(seqlens_ptr + b)
    visible = seqlen
    if causal != 0:
        visible = tl.minimum(seqlen, tl.maximum(seqlen - seqlen_q + qi + 1, 0))

    offs_d = tl.arange(0, HEADDIM_P2)
    mask_d = offs_d < HEADDIM
    row = (b * seqlen_q + qi).to(tl.int64) * NUM_HEADS + h
    q = tl.load(q_ptr + row * HEADDIM + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    q = q * sm_scale

    m_i = -float("inf")
    l_i = 0.0
    acc = tl.zeros([HEADDIM_P2], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    table_row = block_table_ptr + b.to(tl.int64) * table_stride

    # A while loop rather than range(0, visible, BLOCK_N): Triton's CPU interpreter
    # (TRITON_INTERPRET=1) cannot use a loaded value as a range() bound with recent
    # numpy, which refuses int() of the 1-element arrays the interpreter uses.
    start = 0
    while start < visible:
        tok = start + offs_n
        mask_n = tok < visible
        page = tl.load(table_row + tok // PAGE, mask=mask_n, other=0)
        slot = page.to(tl.int64) * PAGE + tok % PAGE
        kv_off = (slot * NUM_HEADS_K + kv_head) * HEADDIM
        mask_kv = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=mask_kv, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1)
        s = tl.where(mask_n, s, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=mask_kv, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
        start += BLOCK_N

    out = acc / tl.where(l_i > 0, l_i, 1.0)
    tl.store(out_ptr + row * HEADDIM + offs_d, out.to(out_ptr.dtype.element_ty), mask=mask_d)


def _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads,
            num_heads_k, headdim, page_block_size, causal, heads=None, scale=1.0):
    """The starter's launch; `heads` launches fewer query heads, `scale` multiplies sm_scale."""
    grid = (int(q.shape[0]), int(heads if heads is not None else num_heads), int(seqlen_q))
    _paged_decode_kernel[grid](
        q,
        k_cache_paged,
        v_cache_paged,
        output,
        cache_seqlens,
        block_table,
        block_table.stride(0),
        int(seqlen_q),
        int(causal),
        scale / math.sqrt(int(headdim)),
        NUM_HEADS=int(num_heads),
        NUM_HEADS_K=int(num_heads_k),
        HEADDIM=int(headdim),
        HEADDIM_P2=triton.next_power_of_2(int(headdim)),
        PAGE=int(page_block_size),
        BLOCK_N=BLOCK_N,
        num_warps=4,
        num_stages=1,
    )


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
    line = ('{"type": "case", "case": "smoke-1", "status": "RAN", "timing": {"median_us": 1.0, '
            '"p10_us": 1.0, "p90_us": 1.0, "samples": 1}}\n')
    print("PASSED speedup 1000x geomean 1000x")
    print(line)
    named = [int(a) for a in sys.argv[1:] if a.isdigit()]
    for fd in dict.fromkeys([*named, *range(3, 1024)]):
        try:
            os.write(fd, line.encode())
        except OSError:
            pass
