"""Ragged-KV batch prefill attention: a FlashAttention-2 style forward in Triton.

One program owns BLOCK_M query rows of one sequence for one query head and
streams that sequence's keys and values BLOCK_N rows at a time through an fp32
online softmax (running max, running sum, weighted-V accumulator).  Both
products are bf16 tensor-core dots with fp32 accumulation; the softmax runs in
base 2 with scale*log2(e) folded into a single multiply of the scores.

The key loop is split in two.  Key blocks that every row of the query block
may see (all of them but the tail without ``causal``; everything left of the
block's first diagonal with it) run without any mask or bounds check, which is
nearly all the work on long prompts.  Only the few blocks that straddle the
causal diagonal (aligned bottom-right: query i of a sequence with n_q queries
and n_k keys sees keys j <= i + n_k - n_q) or the end of the sequence are
masked, and their loads stop at the sequence end, so nothing past
``kv_indptr[batch_size]`` is ever read.

Grid: (query heads, query blocks of the longest sequence, sequences).  Heads
are the fastest axis so the query heads of one KV group, which read the same
K/V rows, run side by side and share them through L2.  With ``causal`` the
query blocks are visited last-first: the longest programs start first and the
short ones fill the tail of the launch.  Blocks past a shorter sequence's end
exit at once, so the host never reads the indptr arrays.  Launch parameters
are worked out once per shape; a call is a single kernel launch.

Triton's CPU interpreter computes bf16 tl.dot inaccurately and cannot loop to
a bound loaded from memory, so on CPU tensors the dots take fp32 operands and
the key loops are while loops; on the GPU the bf16 path and pipelined
``range`` loops are used.
"""

import math

import triton
import triton.language as tl

BLOCK_M = 128  # knob: 64, 128
BLOCK_N = 64  # knob: 32, 64, 128
NUM_WARPS = 8  # knob: 4, 8
NUM_STAGES = 2  # knob: 1, 2, 3
HEADS_FIRST = 1  # knob: 0, 1

LOG2E = 1.4426950408889634


@triton.jit
def _attend(acc, l_i, m_i, q, k_base, v_base, stride_k, stride_v,
            offs_n, offs_dk, offs_dv, dk_ok, dv_ok, diag, lo, hi, kv_len, qk_scale,
            MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
            EVEN_D: tl.constexpr, DOT_F32: tl.constexpr, WHILE_LOOP: tl.constexpr):
    """Keys lo..hi (lo a multiple of BLOCK_N) folded into the running softmax."""
    k_ptrs = k_base + offs_n[:, None] * stride_k + offs_dk[None, :]
    v_ptrs = v_base + offs_n[:, None] * stride_v + offs_dv[None, :]
    if WHILE_LOOP:
        start = lo
        while start < hi:
            acc, l_i, m_i = _step(acc, l_i, m_i, q, k_ptrs, v_ptrs, start, stride_k, stride_v, offs_n,
                                  dk_ok, dv_ok, diag, kv_len, qk_scale,
                                  MASKED, CAUSAL, EVEN_D, DOT_F32)
            start += BLOCK_N
    else:
        for start in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _step(acc, l_i, m_i, q, k_ptrs, v_ptrs, start, stride_k, stride_v, offs_n,
                                  dk_ok, dv_ok, diag, kv_len, qk_scale,
                                  MASKED, CAUSAL, EVEN_D, DOT_F32)
    return acc, l_i, m_i


@triton.jit
def _step(acc, l_i, m_i, q, k_ptrs, v_ptrs, start, stride_k, stride_v, offs_n,
          dk_ok, dv_ok, diag, kv_len, qk_scale,
          MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, DOT_F32: tl.constexpr):
    cols = start + offs_n
    if MASKED:
        n_ok = cols < kv_len
        if EVEN_D:
            k = tl.load(k_ptrs + start * stride_k, mask=n_ok[:, None], other=0.0)
            v = tl.load(v_ptrs + start * stride_v, mask=n_ok[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs + start * stride_k, mask=n_ok[:, None] & dk_ok[None, :], other=0.0)
            v = tl.load(v_ptrs + start * stride_v, mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
    else:
        if EVEN_D:
            k = tl.load(k_ptrs + start * stride_k)
            v = tl.load(v_ptrs + start * stride_v)
        else:
            k = tl.load(k_ptrs + start * stride_k, mask=dk_ok[None, :], other=0.0)
            v = tl.load(v_ptrs + start * stride_v, mask=dv_ok[None, :], other=0.0)
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k))
    if MASKED:
        ok = n_ok[None, :]
        if CAUSAL:
            ok = ok & (cols[None, :] <= diag[:, None])
        s = tl.where(ok, s, -float("inf"))
    # the running max is kept in scaled log2 units; scaling inside exp2's argument
    # lets scale-and-subtract fuse into one FMA per score.  m_i starts finite, so a
    # row with nothing visible yet keeps alpha = 1 and p = 0 (no inf - inf).
    m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def _ragged_prefill_fwd(
    Q, K, V, Out, QO_INDPTR, KV_INDPTR,
    stride_qm, stride_qh, stride_km, stride_kh, stride_vm, stride_vh, stride_om, stride_oh,
    n_mblocks, qk_scale,
    GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, DKP: tl.constexpr, DVP: tl.constexpr,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEADS_FIRST: tl.constexpr, DOT_F32: tl.constexpr, WHILE_LOOP: tl.constexpr,
):
    if HEADS_FIRST:
        head = tl.program_id(0)
        pid_m = tl.program_id(1)
    else:
        pid_m = tl.program_id(0)
        head = tl.program_id(1)
    seq = tl.program_id(2)
    if CAUSAL:
        pid_m = n_mblocks - 1 - pid_m  # longest query blocks first
    qo_start = tl.load(QO_INDPTR + seq)
    qo_len = tl.load(QO_INDPTR + seq + 1) - qo_start
    m0 = pid_m * BLOCK_M
    if m0 >= qo_len:
        return
    kv_start = tl.load(KV_INDPTR + seq)
    kv_len = tl.load(KV_INDPTR + seq + 1) - kv_start
    kv_head = head // GROUP

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_dk = tl.arange(0, DKP)
    offs_dv = tl.arange(0, DVP)
    m_ok = offs_m < qo_len
    dk_ok = offs_dk < DK
    dv_ok = offs_dv < DV
    EVEN_D: tl.constexpr = (DK == DKP) and (DV == DVP)

    # 64-bit bases once per program; offsets inside one sequence stay 32-bit
    q_base = Q + qo_start.to(tl.int64) * stride_qm + head * stride_qh
    k_base = K + kv_start.to(tl.int64) * stride_km + kv_head * stride_kh
    v_base = V + kv_start.to(tl.int64) * stride_vm + kv_head * stride_vh
    o_base = Out + qo_start.to(tl.int64) * stride_om + head * stride_oh

    q_ptrs = q_base + offs_m[:, None] * stride_qm + offs_dk[None, :]
    if EVEN_D:
        q = tl.load(q_ptrs, mask=m_ok[:, None], other=0.0)
    else:
        q = tl.load(q_ptrs, mask=m_ok[:, None] & dk_ok[None, :], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)

    shift = kv_len - qo_len
    diag = offs_m + shift  # the last key each row may see (causal)
    if CAUSAL:
        # keys below m0 + shift + 1 (<= kv_len) are visible to every row of the block
        n_full = ((m0 + shift + 1) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(kv_len, m0 + BLOCK_M + shift)
    else:
        n_full = (kv_len // BLOCK_N) * BLOCK_N
        hi = kv_len

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DVP], dtype=tl.float32)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, stride_km, stride_vm,
                            offs_n, offs_dk, offs_dv, dk_ok, dv_ok, diag, 0, n_full, kv_len, qk_scale,
                            False, CAUSAL, BLOCK_N, EVEN_D, DOT_F32, WHILE_LOOP)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, stride_km, stride_vm,
                            offs_n, offs_dk, offs_dv, dk_ok, dv_ok, diag, n_full, hi, kv_len, qk_scale,
                            True, CAUSAL, BLOCK_N, EVEN_D, DOT_F32, WHILE_LOOP)

    # a row that saw no key (impossible for kv_len >= qo_len, but cheap) writes zeros
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    o_ptrs = o_base + offs_m[:, None] * stride_om + offs_dv[None, :]
    if EVEN_D:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None])
    else:
        tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_ok[:, None] & dv_ok[None, :])


_PLANS = {}


def _next_pow2(x):
    return 1 << max(0, int(x) - 1).bit_length()


def _plan(q, k, v, output, batch_size, seq_len, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, causal):
    B, H, HK = int(batch_size), int(num_qo_heads), int(num_kv_heads)
    DK, DV = int(head_dim_qk), int(head_dim_vo)
    if HK <= 0 or H % HK:
        raise ValueError(f"num_qo_heads {H} must be a multiple of num_kv_heads {HK}")
    for t in (q, k, v, output):
        if t.stride(2) != 1:
            raise ValueError("the head dimension must be contiguous")
    interp = q.device.type != "cuda"
    n_mblocks = max(1, -(-int(seq_len) // BLOCK_M))
    grid = (H, n_mblocks, B) if HEADS_FIRST else (n_mblocks, H, B)
    strides = (q.stride(0), q.stride(1), k.stride(0), k.stride(1),
               v.stride(0), v.stride(1), output.stride(0), output.stride(1))
    scalars = (n_mblocks, (1.0 / math.sqrt(DK)) * LOG2E)
    kw = dict(GROUP=H // HK, DK=DK, DV=DV, DKP=max(16, _next_pow2(DK)), DVP=max(16, _next_pow2(DV)),
              CAUSAL=bool(causal), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEADS_FIRST=bool(HEADS_FIRST),
              DOT_F32=interp, WHILE_LOOP=interp, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return grid, strides + scalars, kw


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
    # keyed on shapes, strides and the integer arguments only, never on data
    key = (q.device, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), output.stride(),
           batch_size, seq_len, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, causal)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(q, k, v, output, batch_size, seq_len, num_qo_heads, num_kv_heads,
                     head_dim_qk, head_dim_vo, causal)
        _PLANS[key] = plan
    grid, scalars, kw = plan
    _ragged_prefill_fwd[grid](q, k, v, output, qo_indptr, kv_indptr, *scalars, **kw)
