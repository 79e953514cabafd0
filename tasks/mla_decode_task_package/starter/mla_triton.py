"""MLA decode (DeepSeek latent attention over a paged cache) in Triton: a simple, correct start.

All heads of a sequence read the same cache rows, so one program takes a block
of BLOCK_H heads of one sequence: the heads are the rows of its tiles, as the
queries of a prefill tile would be.  It walks the sequence's tokens BLOCK_N at
a time, looks each token's page up in the block table, scores the tile with two
tl.dot products (latent part and rotary part), and keeps an online softmax
(running max, running sum, weighted latent rows) in float32.  Tokens at or past
cache_seqlens[b] are masked, so ragged lengths and lengths ending mid-page work.

Tiles are converted to float32 before tl.dot: on the GPU that is a TF32 product
(exact for bf16 inputs), and Triton's CPU interpreter computes bf16 tl.dot wrongly.
A fast kernel also splits long sequences over several programs (split-KV) so
that small batches fill the GPU.
"""

import math

import triton
import triton.language as tl

BLOCK_H = 16  # knob: 16, 32, 64
BLOCK_N = 16  # knob: 16, 32, 64


@triton.jit
def _mla_decode_kernel(
    q_nope_ptr,
    q_pe_ptr,
    kv_ptr,
    out_ptr,
    seqlens_ptr,
    block_table_ptr,
    table_stride,
    sm_scale,
    NUM_HEADS: tl.constexpr,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h_block = tl.program_id(1)
    seqlen = tl.load(seqlens_ptr + b)

    offs_h = h_block * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < NUM_HEADS
    offs_r = tl.arange(0, RANK)
    offs_p = tl.arange(0, ROPE)
    rows_h = b.to(tl.int64) * NUM_HEADS + offs_h
    q_nope = tl.load(q_nope_ptr + rows_h[:, None] * RANK + offs_r[None, :], mask=mask_h[:, None], other=0.0)
    q_pe = tl.load(q_pe_ptr + rows_h[:, None] * ROPE + offs_p[None, :], mask=mask_h[:, None], other=0.0)
    q_nope = q_nope.to(tl.float32) * sm_scale
    q_pe = q_pe.to(tl.float32) * sm_scale

    m_i = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, RANK], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    table_row = block_table_ptr + b.to(tl.int64) * table_stride

    # A while loop rather than range(0, seqlen, BLOCK_N): Triton's CPU interpreter
    # cannot use a loaded value as a range() bound with recent numpy.
    start = 0
    while start < seqlen:
        tok = start + offs_n
        mask_n = tok < seqlen
        page = tl.load(table_row + tok // PAGE, mask=mask_n, other=0)
        row = (page.to(tl.int64) * PAGE + tok % PAGE) * (RANK + ROPE)
        c = tl.load(kv_ptr + row[:, None] + offs_r[None, :], mask=mask_n[:, None], other=0.0).to(tl.float32)
        k_pe = tl.load(kv_ptr + row[:, None] + RANK + offs_p[None, :], mask=mask_n[:, None], other=0.0)
        s = tl.dot(q_nope, tl.trans(c)) + tl.dot(q_pe, tl.trans(k_pe.to(tl.float32)))  # (BLOCK_H, BLOCK_N)
        s = tl.where(mask_n[None, :], s, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        acc = acc * alpha[:, None] + tl.dot(p, c)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
        start += BLOCK_N

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + rows_h[:, None] * RANK + offs_r[None, :], out.to(out_ptr.dtype.element_ty), mask=mask_h[:, None])


def run_kernel(
    q_nope,
    q_pe,
    kv_cache,
    output,
    cache_seqlens,
    block_table,
    batch_size,
    max_seqlen,
    num_heads,
    kv_lora_rank,
    qk_rope_dim,
    page_block_size,
    num_blocks,
):
    grid = (int(batch_size), triton.cdiv(int(num_heads), BLOCK_H))
    _mla_decode_kernel[grid](
        q_nope,
        q_pe,
        kv_cache,
        output,
        cache_seqlens,
        block_table,
        block_table.stride(0),
        1.0 / math.sqrt(int(kv_lora_rank) + int(qk_rope_dim)),
        NUM_HEADS=int(num_heads),
        RANK=int(kv_lora_rank),
        ROPE=int(qk_rope_dim),
        PAGE=int(page_block_size),
        BLOCK_H=BLOCK_H,
        BLOCK_N=BLOCK_N,
        num_warps=8,
        num_stages=1,
    )
