"""Paged-KV decode attention, Triton split-KV reading several kv heads per program.

A page stores each token's kv heads side by side (num_heads_k*headdim values),
so one program that handles HEADS_PER_PROG kv heads of a (batch, split) reads
HEADS_PER_PROG*headdim*2 contiguous bytes per token instead of headdim*2 at a
stride of num_heads_k*headdim*2: longer bursts, and the heads of one page are
read together rather than by different programs at different times.

MHA decode (num_heads == num_heads_k, seqlen_q == 1): grid = splits x
batch*(head groups); K/V tiles are [tokens, heads, headdim], fp32 online softmax
per head.  Other shapes (GQA groups, seqlen_q > 1, causal) use a per-kv-head
kernel with tl.dot and query rows padded to 16.  Every program writes an
unnormalised partial (acc, m, l) and a second kernel merges the splits that saw
tokens; a single split writes the output directly.

The split count is sized from the compiled kernel's occupancy: about WAVES x
(resident programs per SM) x SMs programs, all splits of equal length, so the
last wave is full.  Loop trip counts are runtime values on a GPU and
compile-time ones in the CPU interpreter (which cannot loop to a runtime
bound); a sequence longer than the planned seqlen_k is finished by the last
split in a data-dependent while loop.
"""

import math

import torch
import triton
import triton.language as tl

HEADS_PER_PROG = 8  # knob: 1, 2, 4, 8
PAGES_PER_ITER = 1  # knob: 1, 2, 4
WAVES = 2  # knob: 1, 2, 3, 4, 8
NUM_WARPS = 8  # knob: 4, 8, 16
COMBINE_WARPS = 4  # knob: 1, 2, 4, 8
SPLIT_CHUNK = 16  # knob: 8, 16, 32, 64

LOG2E = 1.4426950408889634


@triton.jit
def _step_heads(K, V, bt_row, page, n0, end, hoff, q, m_i, l_i, acc, offs_n, offs_h, offs_d, d_ok,
                HK: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                EVEN_D: tl.constexpr):
    """One BLOCK_N-token step for HPP heads (one query row each; q pre-scaled by scale*log2e)."""
    tok = n0 + offs_n
    valid = tok < end
    row = page.to(tl.int64) * (PAGE * HK * D) + (tok % PAGE) * (HK * D) + hoff
    tok_nx = tok + BLOCK_N
    page_nx = tl.load(bt_row + tok_nx // PAGE, mask=tok_nx < end, other=0)
    ptrs = row[:, None, None] + (offs_h * D)[None, :, None] + offs_d[None, None, :]
    if EVEN_D:
        kv_mask = valid[:, None, None]
    else:
        kv_mask = valid[:, None, None] & d_ok[None, None, :]
    k = tl.load(K + ptrs, mask=kv_mask, other=0.0).to(tl.float32)
    v = tl.load(V + ptrs, mask=kv_mask, other=0.0).to(tl.float32)
    s = tl.sum(k * q[None, :, :], axis=2)  # [BLOCK_N, HPP]
    s = tl.where(valid[:, None], s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=0))  # every step has a valid token: finite
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[None, :])
    l_i = l_i * alpha + tl.sum(p, axis=0)
    acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v, axis=0)
    return page_nx, m_new, l_i, acc


@triton.jit
def _split_heads(
    Q, K, V, Out, Mbuf, Lbuf, Abuf, SEQLENS, BT,
    bt_stride, bt_tokens, n_splits, split_tokens, iters, qk_scale,
    H: tl.constexpr, HK: tl.constexpr, HPP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, ITERS: tl.constexpr, DIRECT: tl.constexpr,
):
    pid_s = tl.program_id(0)
    pid_bg = tl.program_id(1)
    b = pid_bg // (HK // HPP)
    hg = pid_bg % (HK // HPP)

    # issue the independent loads first: sequence length, first page ids, q
    seq_len = tl.load(SEQLENS + b)
    start = pid_s * split_tokens
    offs_n = tl.arange(0, BLOCK_N)
    offs_h = tl.arange(0, HPP)
    offs_d = tl.arange(0, DP)
    d_ok = offs_d < D
    bt_row = BT + b.to(tl.int64) * bt_stride
    tok = start + offs_n
    page = tl.load(bt_row + tok // PAGE, mask=tok < bt_tokens, other=0)
    orow = b * H + hg * HPP + offs_h  # output rows (H == HK here)
    rc_ptrs = orow.to(tl.int64)[:, None] * D + offs_d[None, :]
    rc_mask = d_ok[None, :] & (offs_h < HPP)[:, None]
    q = tl.load(Q + rc_ptrs, mask=rc_mask, other=0.0).to(tl.float32) * qk_scale

    last = pid_s == n_splits - 1
    end = tl.minimum(start + split_tokens, seq_len)
    if last:
        end = seq_len  # the last split also takes any overflow past the planned length
    if start < end:
        hoff = hg * (HPP * D)
        m_i = tl.full([HPP], -float("inf"), dtype=tl.float32)
        l_i = tl.zeros([HPP], dtype=tl.float32)
        acc = tl.zeros([HPP, DP], dtype=tl.float32)
        if ITERS > 0:  # compile-time trip count (CPU interpreter)
            for it in range(ITERS):
                page, m_i, l_i, acc = _step_heads(K, V, bt_row, page, start + it * BLOCK_N, end, hoff, q,
                                                  m_i, l_i, acc, offs_n, offs_h, offs_d, d_ok,
                                                  HK, D, PAGE, BLOCK_N, D == DP)
        else:
            for it in range(iters):
                page, m_i, l_i, acc = _step_heads(K, V, bt_row, page, start + it * BLOCK_N, end, hoff, q,
                                                  m_i, l_i, acc, offs_n, offs_h, offs_d, d_ok,
                                                  HK, D, PAGE, BLOCK_N, D == DP)
        if last:
            n0 = start + split_tokens
            while n0 < end:
                page, m_i, l_i, acc = _step_heads(K, V, bt_row, page, n0, end, hoff, q,
                                                  m_i, l_i, acc, offs_n, offs_h, offs_d, d_ok,
                                                  HK, D, PAGE, BLOCK_N, D == DP)
                n0 += BLOCK_N
        if DIRECT:
            tl.store(Out + rc_ptrs, (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=rc_mask)
        else:
            sidx = orow.to(tl.int64) * n_splits + pid_s
            tl.store(Mbuf + sidx, m_i)
            tl.store(Lbuf + sidx, l_i)
            tl.store(Abuf + sidx[:, None] * D + offs_d[None, :], acc, mask=rc_mask)
    else:
        if DIRECT:  # empty sequence: nothing to attend to, write zeros
            tl.store(Out + rc_ptrs, tl.zeros([HPP, DP], dtype=Out.dtype.element_ty), mask=rc_mask)


@triton.jit
def _step_rows(K, V, bt_row, page, n0, end, head_off, q, m_i, l_i, acc, offs_n, offs_d, d_ok,
               lim, qk_scale,
               HK: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
               IS_CAUSAL: tl.constexpr, DOT_F32: tl.constexpr):
    """One BLOCK_N-token step for ROWS_P query rows of one kv head on tensor cores."""
    tok = n0 + offs_n
    valid = tok < end
    row = page.to(tl.int64) * (PAGE * HK * D) + (tok % PAGE) * (HK * D) + head_off
    tok_nx = tok + BLOCK_N
    page_nx = tl.load(bt_row + tok_nx // PAGE, mask=tok_nx < end, other=0)
    ptrs = row[:, None] + offs_d[None, :]
    kv_mask = valid[:, None] & d_ok[None, :]
    k = tl.load(K + ptrs, mask=kv_mask, other=0.0)
    v = tl.load(V + ptrs, mask=kv_mask, other=0.0)
    if DOT_F32:  # the CPU interpreter's bf16 dot is unreliable; GPUs take the bf16 path
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    ok = valid[None, :]
    if IS_CAUSAL:
        ok = ok & (tok[None, :] < lim[:, None])
    s = tl.where(ok, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return page_nx, m_new, l_i, acc


@triton.jit
def _split_rows(
    Q, K, V, Out, Mbuf, Lbuf, Abuf, SEQLENS, BT,
    bt_stride, bt_tokens, n_splits, split_tokens, iters, qk_scale,
    H: tl.constexpr, HK: tl.constexpr, GROUP: tl.constexpr, SQ: tl.constexpr,
    D: tl.constexpr, DP: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    ITERS: tl.constexpr, ROWS: tl.constexpr, ROWS_P: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DIRECT: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HK
    hk = pid_bh % HK

    seq_len = tl.load(SEQLENS + b)
    start = pid_s * split_tokens
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DP)
    d_ok = offs_d < D
    bt_row = BT + b.to(tl.int64) * bt_stride
    tok = start + offs_n
    page = tl.load(bt_row + tok // PAGE, mask=tok < bt_tokens, other=0)
    offs_r = tl.arange(0, ROWS_P)
    r_ok = offs_r < ROWS
    r_sq = offs_r // GROUP
    orow = (b * SQ + r_sq) * H + hk * GROUP + offs_r % GROUP  # output row per query row
    rc_ptrs = orow.to(tl.int64)[:, None] * D + offs_d[None, :]
    rc_mask = r_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + rc_ptrs, mask=rc_mask, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)

    last = pid_s == n_splits - 1
    end = tl.minimum(start + split_tokens, seq_len)
    if last:
        end = seq_len
    if start < end:
        head_off = hk * D
        m_i = tl.full([ROWS_P], -float("inf"), dtype=tl.float32)
        l_i = tl.zeros([ROWS_P], dtype=tl.float32)
        acc = tl.zeros([ROWS_P, DP], dtype=tl.float32)
        # causal, aligned bottom-right: query row sq sees keys < seq_len - SQ + 1 + sq
        lim = seq_len - SQ + 1 + r_sq
        if ITERS > 0:
            for it in range(ITERS):
                page, m_i, l_i, acc = _step_rows(K, V, bt_row, page, start + it * BLOCK_N, end, head_off,
                                                 q, m_i, l_i, acc, offs_n, offs_d, d_ok, lim, qk_scale,
                                                 HK, D, PAGE, BLOCK_N, IS_CAUSAL, DOT_F32)
        else:
            for it in range(iters):
                page, m_i, l_i, acc = _step_rows(K, V, bt_row, page, start + it * BLOCK_N, end, head_off,
                                                 q, m_i, l_i, acc, offs_n, offs_d, d_ok, lim, qk_scale,
                                                 HK, D, PAGE, BLOCK_N, IS_CAUSAL, DOT_F32)
        if last:
            n0 = start + split_tokens
            while n0 < end:
                page, m_i, l_i, acc = _step_rows(K, V, bt_row, page, n0, end, head_off,
                                                 q, m_i, l_i, acc, offs_n, offs_d, d_ok, lim, qk_scale,
                                                 HK, D, PAGE, BLOCK_N, IS_CAUSAL, DOT_F32)
                n0 += BLOCK_N
        if DIRECT:
            l_safe = tl.where(l_i == 0.0, 1.0, l_i)
            tl.store(Out + rc_ptrs, (acc / l_safe[:, None]).to(Out.dtype.element_ty), mask=rc_mask)
        else:
            sidx = orow.to(tl.int64) * n_splits + pid_s
            tl.store(Mbuf + sidx, m_i, mask=r_ok)
            tl.store(Lbuf + sidx, l_i, mask=r_ok)
            tl.store(Abuf + sidx[:, None] * D + offs_d[None, :], acc, mask=rc_mask)
    else:
        if DIRECT:  # empty sequence: nothing to attend to, write zeros
            tl.store(Out + rc_ptrs, tl.zeros([ROWS_P, DP], dtype=Out.dtype.element_ty), mask=rc_mask)


@triton.jit
def _combine_chunk(Mbuf, Lbuf, Abuf, base, sp, n_act, mx, l_tot, o, offs_d, d_ok, D: tl.constexpr):
    c_ok = sp < n_act
    sm = tl.load(Mbuf + base + sp, mask=c_ok, other=-float("inf"))
    sl = tl.load(Lbuf + base + sp, mask=c_ok, other=0.0)
    w = tl.exp2(sm - mx)
    a = tl.load(Abuf + (base + sp)[:, None] * D + offs_d[None, :],
                mask=c_ok[:, None] & d_ok[None, :], other=0.0)
    return l_tot + w * sl, o + w[:, None] * a


@triton.jit
def _combine(
    Out, Mbuf, Lbuf, Abuf, SEQLENS, n_splits, split_tokens, n_chunks,
    SQH: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, CHUNK: tl.constexpr, NCHUNK: tl.constexpr,
):
    orow = tl.program_id(0)
    b = orow // SQH
    seq_len = tl.load(SEQLENS + b)
    n_act = tl.minimum((seq_len + split_tokens - 1) // split_tokens, n_splits)
    base = orow.to(tl.int64) * n_splits
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, DP)
    d_ok = offs_d < D
    m_max = tl.full([CHUNK], -float("inf"), dtype=tl.float32)
    if NCHUNK > 0:  # compile-time trip count (CPU interpreter)
        for c in range(NCHUNK):
            sp = c * CHUNK + offs_c
            m_max = tl.maximum(m_max, tl.load(Mbuf + base + sp, mask=sp < n_act, other=-float("inf")))
    else:
        for c in range(n_chunks):
            sp = c * CHUNK + offs_c
            m_max = tl.maximum(m_max, tl.load(Mbuf + base + sp, mask=sp < n_act, other=-float("inf")))
    mx = tl.max(m_max, axis=0)
    mx = tl.where(mx == -float("inf"), 0.0, mx)
    l_tot = tl.zeros([CHUNK], dtype=tl.float32)
    o = tl.zeros([CHUNK, DP], dtype=tl.float32)
    if NCHUNK > 0:
        for c in range(NCHUNK):
            l_tot, o = _combine_chunk(Mbuf, Lbuf, Abuf, base, c * CHUNK + offs_c, n_act, mx, l_tot, o,
                                      offs_d, d_ok, D)
    else:
        for c in range(n_chunks):
            l_tot, o = _combine_chunk(Mbuf, Lbuf, Abuf, base, c * CHUNK + offs_c, n_act, mx, l_tot, o,
                                      offs_d, d_ok, D)
    l_sum = tl.sum(l_tot, axis=0)
    l_sum = tl.where(l_sum == 0.0, 1.0, l_sum)
    out = tl.sum(o, axis=0) / l_sum
    tl.store(Out + orow.to(tl.int64) * D + offs_d, out.to(Out.dtype.element_ty), mask=d_ok)


_SMS = {}
_PLANS = {}


def _sm_count(device):
    key = (device.type, device.index)
    n = _SMS.get(key)
    if n is None:
        if device.type == "cuda":
            n = torch.cuda.get_device_properties(device).multi_processor_count
        else:
            n = 132  # CPU / interpreter runs: plan as for an H200
        _SMS[key] = n
    return n


def _resident_per_sm(kernel, args, kw):
    """Programs of the compiled kernel that fit on one SM at once (registers, threads, smem)."""
    try:
        ck = kernel.warmup(*args, grid=(1,), **kw)
        ck._init_handles()
        regs = max(1, int(ck.n_regs))
        warps = int(ck.metadata.num_warps)
        smem = int(ck.metadata.shared)
    except Exception:
        return 2
    regs_per_warp = ((regs * 32 + 255) // 256) * 256
    by_regs = 65536 // (regs_per_warp * warps)
    by_threads = 2048 // (32 * warps)
    by_smem = (228 * 1024) // (smem + 1024)
    return max(1, min(by_regs, by_threads, by_smem, 32))


def _next_pow2(x):
    return 1 << max(0, int(x) - 1).bit_length()


def _cdiv(a, b):
    return -(-a // b)


def _make_plan(q, k, v, out, seqlens, block_table, batch_size, seqlen_k, seqlen_q, num_heads, num_heads_k,
               headdim, page_block_size, causal):
    B, SQ, H, HK, D, PAGE = (int(batch_size), int(seqlen_q), int(num_heads), int(num_heads_k),
                             int(headdim), int(page_block_size))
    if HK <= 0 or H % HK != 0:
        raise ValueError(f"num_heads {H} must be a multiple of num_heads_k {HK}")
    dev = q.device
    interp = dev.type != "cuda"
    GROUP = H // HK
    ROWS = GROUP * SQ
    heads_path = ROWS == 1
    DP = max(16, _next_pow2(D))
    BLOCK_N = max(16, _next_pow2(PAGES_PER_ITER * PAGE))
    if heads_path:
        hpp = 1
        while hpp * 2 <= min(HEADS_PER_PROG, HK) and HK % (hpp * 2) == 0:
            hpp *= 2
        units = B * (HK // hpp)
        kernel = _split_heads
    else:
        hpp = 1
        units = B * HK
        kernel = _split_rows
    iters_total = max(1, _cdiv(max(int(seqlen_k), 1), BLOCK_N))
    n_rows = B * SQ * H
    qk_scale = (1.0 / math.sqrt(D)) * LOG2E
    bt_info = (int(block_table.stride(0)), int(block_table.shape[1]) * PAGE)

    def kwargs(direct, iters):
        kw = dict(H=H, HK=HK, D=D, DP=DP, PAGE=PAGE, BLOCK_N=BLOCK_N, ITERS=iters if interp else 0,
                  DIRECT=direct, num_warps=NUM_WARPS)
        if heads_path:
            kw.update(HPP=hpp)
        else:
            kw.update(GROUP=GROUP, SQ=SQ, ROWS=ROWS, ROWS_P=max(16, _next_pow2(ROWS)),
                      IS_CAUSAL=bool(causal) and SQ > 1, DOT_F32=interp)
        return kw

    # size the split count from the compiled kernel's occupancy
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    if interp:
        resident = 4
    else:
        resident = _resident_per_sm(kernel, (q, k, v, out, dummy, dummy, dummy, seqlens, block_table)
                                    + bt_info + (3, 3 * BLOCK_N, 3, qk_scale), kwargs(False, 3))
    slots = WAVES * resident * _sm_count(dev)
    n_splits = max(1, min(slots // units, iters_total))
    iters = _cdiv(iters_total, n_splits)  # whole iterations per split
    n_splits = _cdiv(iters_total, iters)  # so that no planned split is empty
    split_tokens = iters * BLOCK_N
    direct = n_splits == 1
    if direct:
        mbuf = lbuf = abuf = dummy
    else:
        mbuf = torch.empty(n_rows * n_splits, dtype=torch.float32, device=dev)
        lbuf = torch.empty(n_rows * n_splits, dtype=torch.float32, device=dev)
        abuf = torch.empty(n_rows * n_splits * D, dtype=torch.float32, device=dev)
    n_chunks = _cdiv(n_splits, SPLIT_CHUNK)
    comb_kw = dict(SQH=SQ * H, D=D, DP=DP, CHUNK=SPLIT_CHUNK, NCHUNK=n_chunks if interp else 0,
                   num_warps=COMBINE_WARPS)
    split_tail = bt_info + (n_splits, split_tokens, iters, qk_scale)
    return (kernel, (n_splits, units), (mbuf, lbuf, abuf), split_tail, kwargs(direct, iters),
            None if direct else ((n_rows,), (n_splits, split_tokens, n_chunks), comb_kw))


def run_kernel(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table,
               batch_size, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim,
               page_block_size, num_blocks, causal):
    key = (q.device, batch_size, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim,
           page_block_size, block_table.stride(0), causal)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, batch_size,
                          seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
        _PLANS[key] = plan
    kernel, grid, bufs, tail, kw, comb = plan
    kernel[grid](q, k_cache_paged, v_cache_paged, output, *bufs, cache_seqlens, block_table, *tail, **kw)
    if comb is not None:
        cgrid, ctail, ckw = comb
        _combine[cgrid](output, *bufs, cache_seqlens, *ctail, **ckw)
