"""A known cheat for the ragged prefill task, kept as a test input (not a test module).

The contest's own FlashInfer smoke kernel (seed package, starter/示例冒烟代码.md)
computes real attention only for the first 1024 query rows of each sequence
when the batch is large, and fills every later row with the running mean of V
(``mean(v[kv_begin .. kv_begin + t])`` for row t).  On long random sequences
that answer is close to zero, like the real one, so an element-wise
``allclose(atol=1e-2)`` check lets it through.

This Triton kernel does the same with a threshold small enough to trigger on the
manifest's CPU cases: rows at positions >= EXACT_LEN of any sequence get the
prefix mean, the others real attention.  tests/test_more_tasks.py asserts that
``optagent eval`` calls it INCORRECT.
"""

import math

import triton
import triton.language as tl

EXACT_LEN = 32  # rows at or past this position get the prefix mean instead of attention
BLOCK_M = 16
BLOCK_N = 16


@triton.jit
def _exact_or_mean_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    qo_indptr_ptr,
    kv_indptr_ptr,
    sm_scale,
    EXACT_LEN: tl.constexpr,
    NUM_QO_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    DIM: tl.constexpr,
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

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DIM)
    mask_m = offs_m < qo_len
    rows = (qo_start + offs_m).to(tl.int64) * NUM_QO_HEADS + head
    out_ptrs = out_ptr + rows[:, None] * DIM + offs_d[None, :]

    if m_block * BLOCK_M >= EXACT_LEN:
        # The shortcut: the running mean of V by query position, whatever q and k say.
        acc = tl.zeros([BLOCK_M, DIM], dtype=tl.float32)
        start_n = 0
        while start_n < (m_block + 1) * BLOCK_M:
            cols = start_n + offs_n
            kv_rows = (kv_start + cols).to(tl.int64) * NUM_KV_HEADS + kv_head
            v = tl.load(v_ptr + kv_rows[:, None] * DIM + offs_d[None, :], mask=(cols < kv_len)[:, None], other=0.0)
            take = (cols[None, :] <= offs_m[:, None]).to(tl.float32)
            acc += tl.dot(take, v.to(tl.float32))
            start_n += BLOCK_N
        mean = acc / (offs_m + 1).to(tl.float32)[:, None]
        tl.store(out_ptrs, mean.to(out_ptr.dtype.element_ty), mask=mask_m[:, None])
        return

    # Real attention for the first EXACT_LEN rows.
    q = tl.load(q_ptr + rows[:, None] * DIM + offs_d[None, :], mask=mask_m[:, None], other=0.0)
    q = q.to(tl.float32) * sm_scale
    shift = kv_len - qo_len
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DIM], dtype=tl.float32)
    start_n = 0
    while start_n < kv_len:
        cols = start_n + offs_n
        mask_n = cols < kv_len
        kv_rows = (kv_start + cols).to(tl.int64) * NUM_KV_HEADS + kv_head
        k = tl.load(k_ptr + kv_rows[:, None] * DIM + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k.to(tl.float32)))
        visible = mask_n[None, :] & (offs_m[:, None] >= 0)
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + shift)
        s = tl.where(visible, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(v_ptr + kv_rows[:, None] * DIM + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
        start_n += BLOCK_N
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask_m[:, None])


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
    _exact_or_mean_kernel[grid](
        q,
        k,
        v,
        output,
        qo_indptr,
        kv_indptr,
        1.0 / math.sqrt(int(head_dim_qk)),
        EXACT_LEN=EXACT_LEN,
        NUM_QO_HEADS=int(num_qo_heads),
        NUM_KV_HEADS=int(num_kv_heads),
        DIM=int(head_dim_qk),
        CAUSAL=bool(causal),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
    )
