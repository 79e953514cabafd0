"""Paged-KV decode attention, Triton split-KV with GQA and a fused combine.

One kernel: grid = splits x batch*kv_heads.  A program streams a contiguous
range of pages of one (batch, kv head) through an fp32 online softmax for all
query rows sharing that kv head (GROUP query heads x seqlen_q).  If its split is
the only one that sees tokens it writes the output; otherwise it writes an
unnormalised partial (acc, m, l) to fp32 scratch and takes a ticket from a
per-(batch, kv head) atomic counter; the program that takes the last ticket
merges every split's partial, writes the output and resets the counter (so
the kernel replays in a CUDA graph).  Saves the second launch of the two-kernel
version, which matters for short sequences.

GROUP*seqlen_q == 1 (the contest's H == Hk) takes an elementwise path; larger
groups use tl.dot with rows padded to 16.  Page ids are loaded one iteration
ahead.  Loop trip counts are runtime values on a GPU and compile-time ones in
the CPU interpreter; a sequence longer than the planned seqlen_k is finished by
the last split in a data-dependent while loop.
"""

import math

import torch
import triton
import triton.language as tl

PAGES_PER_ITER = 8  # knob: 1, 2, 4, 8
WAVES = 1  # knob: 1, 2, 3, 4, 8
NUM_WARPS = 4  # knob: 1, 2, 4, 8
NUM_STAGES = 1  # knob: 1, 2, 3
HEAD_MAJOR = 1  # knob: 0, 1
SPLIT_CHUNK = 16  # knob: 8, 16, 32, 64

LOG2E = 1.4426950408889634


@triton.jit
def _step_row(K, V, bt_row, page, n0, end, head_off, q, m_i, l_i, acc, offs_n, offs_d, d_ok,
              HK: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr):
    """One BLOCK_N-token step for a single query row (q pre-scaled by scale*log2e)."""
    tok = n0 + offs_n
    valid = tok < end
    row = page.to(tl.int64) * (PAGE * HK * D) + (tok % PAGE) * (HK * D) + head_off
    tok_nx = tok + BLOCK_N
    page_nx = tl.load(bt_row + tok_nx // PAGE, mask=tok_nx < end, other=0)
    ptrs = row[:, None] + offs_d[None, :]
    kv_mask = valid[:, None] & d_ok[None, :]
    k = tl.load(K + ptrs, mask=kv_mask, other=0.0).to(tl.float32)
    v = tl.load(V + ptrs, mask=kv_mask, other=0.0).to(tl.float32)
    s = tl.sum(k * q[None, :], axis=1)
    s = tl.where(valid, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=0))
    m_use = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=0)
    acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
    return page_nx, m_new, l_i, acc


@triton.jit
def _step_rows(K, V, bt_row, page, n0, end, head_off, q, m_i, l_i, acc, offs_n, offs_d, d_ok,
               lim, qk_scale,
               HK: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
               IS_CAUSAL: tl.constexpr, DOT_F32: tl.constexpr):
    """One BLOCK_N-token step for ROWS_P query rows on tensor cores."""
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
def _merge_row(Out, Mbuf, Lbuf, Abuf, orow, n_splits, n_act, n_chunks, offs_d, d_ok,
               D: tl.constexpr, DP: tl.constexpr, CHUNK: tl.constexpr, NCHUNK: tl.constexpr):
    """Merges the n_act partials of one output row (read through L2) and writes it."""
    base = orow.to(tl.int64) * n_splits
    offs_c = tl.arange(0, CHUNK)
    m_max = tl.full([CHUNK], -float("inf"), dtype=tl.float32)
    if NCHUNK > 0:  # compile-time trip count (CPU interpreter)
        for c in range(NCHUNK):
            sp = c * CHUNK + offs_c
            m_max = tl.maximum(m_max, tl.load(Mbuf + base + sp, mask=sp < n_act, other=-float("inf"),
                                              cache_modifier=".cg"))
    else:
        for c in range(n_chunks):
            sp = c * CHUNK + offs_c
            m_max = tl.maximum(m_max, tl.load(Mbuf + base + sp, mask=sp < n_act, other=-float("inf"),
                                              cache_modifier=".cg"))
    mx = tl.max(m_max, axis=0)
    mx = tl.where(mx == -float("inf"), 0.0, mx)
    l_tot = tl.zeros([CHUNK], dtype=tl.float32)
    o = tl.zeros([CHUNK, DP], dtype=tl.float32)
    if NCHUNK > 0:
        for c in range(NCHUNK):
            l_tot, o = _merge_chunk(Mbuf, Lbuf, Abuf, base, c * CHUNK + offs_c, n_act, mx, l_tot, o,
                                    offs_d, d_ok, D)
    else:
        for c in range(n_chunks):
            l_tot, o = _merge_chunk(Mbuf, Lbuf, Abuf, base, c * CHUNK + offs_c, n_act, mx, l_tot, o,
                                    offs_d, d_ok, D)
    l_sum = tl.sum(l_tot, axis=0)
    l_sum = tl.where(l_sum == 0.0, 1.0, l_sum)
    out = tl.sum(o, axis=0) / l_sum
    tl.store(Out + orow.to(tl.int64) * D + offs_d, out.to(Out.dtype.element_ty), mask=d_ok)


@triton.jit
def _merge_chunk(Mbuf, Lbuf, Abuf, base, sp, n_act, mx, l_tot, o, offs_d, d_ok, D: tl.constexpr):
    c_ok = sp < n_act
    sm = tl.load(Mbuf + base + sp, mask=c_ok, other=-float("inf"), cache_modifier=".cg")
    sl = tl.load(Lbuf + base + sp, mask=c_ok, other=0.0, cache_modifier=".cg")
    w = tl.exp2(sm - mx)
    a = tl.load(Abuf + (base + sp)[:, None] * D + offs_d[None, :],
                mask=c_ok[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")
    return l_tot + w * sl, o + w[:, None] * a


@triton.jit
def _paged_decode_split(
    Q, K, V, Out, Mbuf, Lbuf, Abuf, Counter, SEQLENS, BT,
    bt_stride, bt_tokens, n_splits, split_tokens, iters, n_chunks, qk_scale,
    H: tl.constexpr, HK: tl.constexpr, GROUP: tl.constexpr, SQ: tl.constexpr,
    D: tl.constexpr, DP: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    ITERS: tl.constexpr, ROWS: tl.constexpr, ROWS_P: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_F32: tl.constexpr,
    CHUNK: tl.constexpr, NCHUNK: tl.constexpr, HEAD_MAJOR: tl.constexpr,
):
    # heads fastest (HEAD_MAJOR): the programs of all kv heads of a split run side by side
    # and read each page (all heads' rows of a token are adjacent) while it is open
    pid_s = tl.program_id(1) if HEAD_MAJOR else tl.program_id(0)
    pid_bh = tl.program_id(0) if HEAD_MAJOR else tl.program_id(1)
    b = pid_bh // HK
    hk = pid_bh % HK

    # issue the independent loads first: sequence length, first page ids, q
    seq_len = tl.load(SEQLENS + b)
    start = pid_s * split_tokens
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DP)
    d_ok = offs_d < D
    bt_row = BT + b.to(tl.int64) * bt_stride
    tok = start + offs_n
    page = tl.load(bt_row + tok // PAGE, mask=tok < bt_tokens, other=0)
    if ROWS == 1:
        q_base = Q + (b.to(tl.int64) * H + hk * GROUP) * D
        q = tl.load(q_base + offs_d, mask=d_ok, other=0.0).to(tl.float32) * qk_scale
    else:
        offs_r = tl.arange(0, ROWS_P)
        r_ok = offs_r < ROWS
        r_sq = offs_r // GROUP
        orow = (b * SQ + r_sq) * H + hk * GROUP + offs_r % GROUP  # output row per query row
        q_ptrs = Q + orow.to(tl.int64)[:, None] * D + offs_d[None, :]
        q = tl.load(q_ptrs, mask=r_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)

    last = pid_s == n_splits - 1
    end = tl.minimum(start + split_tokens, seq_len)
    if last:
        end = seq_len  # the last split also takes any overflow past the planned length
    # splits that see at least one token (later ones exit at once)
    n_act = tl.minimum((seq_len + split_tokens - 1) // split_tokens, n_splits)
    if start < end:
        head_off = hk * D
        if ROWS == 1:
            m_i = -float("inf")
            l_i = 0.0
            acc = tl.zeros([DP], dtype=tl.float32)
            if ITERS > 0:  # compile-time trip count (CPU interpreter)
                for it in range(ITERS):
                    page, m_i, l_i, acc = _step_row(K, V, bt_row, page, start + it * BLOCK_N, end, head_off,
                                                    q, m_i, l_i, acc, offs_n, offs_d, d_ok,
                                                    HK, D, PAGE, BLOCK_N)
            else:
                for it in range(iters):
                    page, m_i, l_i, acc = _step_row(K, V, bt_row, page, start + it * BLOCK_N, end, head_off,
                                                    q, m_i, l_i, acc, offs_n, offs_d, d_ok,
                                                    HK, D, PAGE, BLOCK_N)
            if last:
                n0 = start + split_tokens
                while n0 < end:
                    page, m_i, l_i, acc = _step_row(K, V, bt_row, page, n0, end, head_off,
                                                    q, m_i, l_i, acc, offs_n, offs_d, d_ok,
                                                    HK, D, PAGE, BLOCK_N)
                    n0 += BLOCK_N
            orow1 = b * H + hk * GROUP
            if n_act == 1:  # the only split that sees tokens: finish here
                o_base = Out + orow1.to(tl.int64) * D
                tl.store(o_base + offs_d, (acc / l_i).to(Out.dtype.element_ty), mask=d_ok)
            else:
                sidx = orow1.to(tl.int64) * n_splits + pid_s
                tl.store(Mbuf + sidx, m_i)
                tl.store(Lbuf + sidx, l_i)
                tl.store(Abuf + sidx * D + offs_d, acc, mask=d_ok)
                tl.debug_barrier()  # every thread's partial is written before the ticket
                ticket = tl.atomic_add(Counter + pid_bh, 1, sem="acq_rel", scope="gpu")
                if ticket == n_act - 1:
                    _merge_row(Out, Mbuf, Lbuf, Abuf, orow1, n_splits, n_act, n_chunks, offs_d, d_ok,
                               D, DP, CHUNK, NCHUNK)
                    tl.atomic_xchg(Counter + pid_bh, 0, sem="relaxed", scope="gpu")
        else:
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
            if n_act == 1:  # the only split that sees tokens: finish here
                l_safe = tl.where(l_i == 0.0, 1.0, l_i)
                o_ptrs = Out + orow.to(tl.int64)[:, None] * D + offs_d[None, :]
                tl.store(o_ptrs, (acc / l_safe[:, None]).to(Out.dtype.element_ty),
                         mask=r_ok[:, None] & d_ok[None, :])
            else:
                sidx = orow.to(tl.int64) * n_splits + pid_s
                tl.store(Mbuf + sidx, m_i, mask=r_ok)
                tl.store(Lbuf + sidx, l_i, mask=r_ok)
                tl.store(Abuf + sidx[:, None] * D + offs_d[None, :], acc,
                         mask=r_ok[:, None] & d_ok[None, :])
                tl.debug_barrier()  # every thread's partial is written before the ticket
                ticket = tl.atomic_add(Counter + pid_bh, 1, sem="acq_rel", scope="gpu")
                if ticket == n_act - 1:
                    for r in range(ROWS):
                        orow_r = (b * SQ + r // GROUP) * H + hk * GROUP + r % GROUP
                        _merge_row(Out, Mbuf, Lbuf, Abuf, orow_r, n_splits, n_act, n_chunks, offs_d, d_ok,
                                   D, DP, CHUNK, NCHUNK)
                    tl.atomic_xchg(Counter + pid_bh, 0, sem="relaxed", scope="gpu")
    else:
        if pid_s == 0:
            # empty sequence: nothing to attend to, write zeros
            offs_r = tl.arange(0, ROWS_P)
            r_ok = offs_r < ROWS
            orow = (b * SQ + offs_r // GROUP) * H + hk * GROUP + offs_r % GROUP
            o_ptrs = Out + orow.to(tl.int64)[:, None] * D + offs_d[None, :]
            tl.store(o_ptrs, tl.zeros([ROWS_P, DP], dtype=Out.dtype.element_ty),
                     mask=r_ok[:, None] & d_ok[None, :])


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
    # trip counts are runtime values on a GPU (one compile serves every length) and
    # compile-time ones in the CPU interpreter, which cannot loop to a runtime bound
    interp = dev.type != "cuda"
    GROUP = H // HK
    ROWS = GROUP * SQ
    ROWS_P = 1 if ROWS == 1 else max(16, _next_pow2(ROWS))
    DP = max(16, _next_pow2(D))
    BLOCK_N = max(16, _next_pow2(PAGES_PER_ITER * PAGE))
    units = B * HK
    n_rows = B * SQ * H
    iters_total = max(1, _cdiv(max(int(seqlen_k), 1), BLOCK_N))
    qk_scale = (1.0 / math.sqrt(D)) * LOG2E
    bt_info = (int(block_table.stride(0)), int(block_table.shape[1]) * PAGE)

    def kwargs(iters, n_chunks):
        return dict(H=H, HK=HK, GROUP=GROUP, SQ=SQ, D=D, DP=DP, PAGE=PAGE, BLOCK_N=BLOCK_N,
                    ITERS=iters if interp else 0, ROWS=ROWS, ROWS_P=ROWS_P, IS_CAUSAL=bool(causal) and SQ > 1,
                    DOT_F32=interp, CHUNK=SPLIT_CHUNK, NCHUNK=n_chunks if interp else 0,
                    num_warps=NUM_WARPS, num_stages=NUM_STAGES, HEAD_MAJOR=HEAD_MAJOR)

    # programs: about WAVES x (programs resident per SM) x SMs, splits of equal length
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    resident = 4 if interp else _resident_per_sm(
        _paged_decode_split, (q, k, v, out, dummy, dummy, dummy, dummy, seqlens, block_table) + bt_info
        + (3, 3 * BLOCK_N, 3, 3, qk_scale), kwargs(3, 3))
    n_splits = max(1, min((WAVES * resident * _sm_count(dev)) // units, iters_total))
    iters = _cdiv(iters_total, n_splits)  # whole iterations per split
    n_splits = _cdiv(iters_total, iters)  # so that no planned split is empty
    split_tokens = iters * BLOCK_N
    mbuf = torch.empty(max(1, n_rows * n_splits), dtype=torch.float32, device=dev)
    lbuf = torch.empty(max(1, n_rows * n_splits), dtype=torch.float32, device=dev)
    abuf = torch.empty(max(1, n_rows * n_splits * D), dtype=torch.float32, device=dev)
    counter = torch.zeros(units, dtype=torch.int32, device=dev)  # reset by each merging program
    n_chunks = _cdiv(n_splits, SPLIT_CHUNK)
    args = (mbuf, lbuf, abuf, counter)
    tail = bt_info + (n_splits, split_tokens, iters, n_chunks, qk_scale)
    grid = (units, n_splits) if HEAD_MAJOR else (n_splits, units)
    return grid, args, tail, kwargs(iters, n_chunks)


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
    grid, args, tail, kw = plan
    _paged_decode_split[grid](q, k_cache_paged, v_cache_paged, output, *args, cache_seqlens, block_table,
                              *tail, **kw)
