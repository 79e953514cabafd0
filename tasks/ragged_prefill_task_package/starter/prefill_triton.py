"""Ragged batch prefill attention in Triton: a simple, correct starting point.

One program per (block of BLOCK_M query rows, query head, sequence).  The grid's
first axis covers the longest query length (``seq_len``); programs past the end
of a shorter sequence return at once.  Each program loads its query tile, walks
the sequence's keys BLOCK_N at a time with an online softmax (running max,
running sum, weighted-V accumulator, all float32) and writes its output rows.

Causal masking follows FlashInfer: the queries are the last qo_len positions of
a sequence of kv_len tokens, so query row i sees keys j <= i + kv_len - qo_len,
and the loop stops at the last key any row of the tile can see.  Query head h
reads KV head h // (num_qo_heads // num_kv_heads) (grouped-query attention).

Tiles are converted to float32 before tl.dot: on the GPU that is a TF32 product
(exact for bf16 inputs), and Triton's CPU interpreter computes bf16 tl.dot wrongly.
"""

import math

import triton
import triton.language as tl

BLOCK_M = 32  # knob: 16, 32, 64
BLOCK_N = 32  # knob: 16, 32, 64


@triton.jit
def _ragged_prefill_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    qo_indptr_ptr,
    kv_indptr_ptr,
    sm_scale,
    NUM_QO_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    DIM_QK: tl.constexpr,
    DIM_VO: tl.constexpr,
    DIM_QK_P2: tl.constexpr,
    DIM_VO_P2: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    m_block = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    kv_head = head // (NUM_QO_HEADS // NUM_KV_HEADS)

    qo_start = tl.load(qo_indptr_ptr + seq)
    qo_len = tl.load(qo_indptr_ptr + seq + 1) - qo_start
    kv_start = tl.load(kv_indptr_ptr + seq)
    kv_len = tl.load(kv_indptr_ptr + seq + 1) - kv_start
    if m_block * BLOCK_M >= qo_len:
        return

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # query positions within the sequence
    offs_n = tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, DIM_QK_P2)
    offs_dv = tl.arange(0, DIM_VO_P2)
    mask_m = offs_m < qo_len
    mask_dk = offs_dk < DIM_QK
    mask_dv = offs_dv < DIM_VO

    q_rows = (qo_start + offs_m).to(tl.int64) * NUM_QO_HEADS + head
    q = tl.load(q_ptr + q_rows[:, None] * DIM_QK + offs_dk[None, :], mask=mask_m[:, None] & mask_dk[None, :], other=0.0)
    q = q.to(tl.float32) * sm_scale

    # Keys a query row may see: all kv_len of them, or (causal) up to its diagonal.
    shift = kv_len - qo_len
    end = kv_len
    if CAUSAL:
        end = tl.minimum(kv_len, shift + (m_block + 1) * BLOCK_M)

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: rows with nothing visible stay NaN-free
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_VO_P2], dtype=tl.float32)

    # A while loop rather than range(0, end, BLOCK_N): Triton's CPU interpreter
    # cannot use a loaded value as a range() bound with recent numpy.
    start_n = 0
    while start_n < end:
        cols = start_n + offs_n
        mask_n = cols < kv_len
        kv_rows = (kv_start + cols).to(tl.int64) * NUM_KV_HEADS + kv_head
        k = tl.load(k_ptr + kv_rows[:, None] * DIM_QK + offs_dk[None, :], mask=mask_n[:, None] & mask_dk[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k.to(tl.float32)))  # (BLOCK_M, BLOCK_N)
        visible = mask_n[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + shift)
        s = tl.where(visible, s, -float("inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(v_ptr + kv_rows[:, None] * DIM_VO + offs_dv[None, :], mask=mask_n[:, None] & mask_dv[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
        start_n += BLOCK_N

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = (qo_start + offs_m).to(tl.int64) * NUM_QO_HEADS + head
    tl.store(
        out_ptr + o_rows[:, None] * DIM_VO + offs_dv[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_dv[None, :],
    )


def run_kernel(
    q,
    k,
    v,
    output,
    qo_indptr,
    kv_indptr,
    batch_size,
    seq_len,
    num_qo_heads,
    num_kv_heads,
    head_dim_qk,
    head_dim_vo,
    causal,
):
    grid = (triton.cdiv(int(seq_len), BLOCK_M), int(num_qo_heads), int(batch_size))
    _ragged_prefill_kernel[grid](
        q,
        k,
        v,
        output,
        qo_indptr,
        kv_indptr,
        1.0 / math.sqrt(int(head_dim_qk)),
        NUM_QO_HEADS=int(num_qo_heads),
        NUM_KV_HEADS=int(num_kv_heads),
        DIM_QK=int(head_dim_qk),
        DIM_VO=int(head_dim_vo),
        DIM_QK_P2=triton.next_power_of_2(int(head_dim_qk)),
        DIM_VO_P2=triton.next_power_of_2(int(head_dim_vo)),
        CAUSAL=bool(causal),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        num_warps=4,
        num_stages=1,
    )
