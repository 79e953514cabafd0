"""MLA decode (DeepSeek latent attention, paged cache) as split-KV flash-decoding in Triton.

Why this shape of kernel: every head of a sequence reads the same latent rows
(512 latent + 64 rotary values per token), so one program takes a block of heads of
one sequence and multiplies its query tile by each cache tile with bf16
``tl.dot`` (fp32 accumulation): the heads are the rows of the tile, as queries
are in prefill.  A decode batch alone gives too few programs to fill the GPU
(one sequence x 128 heads is 8 programs of 16 heads), so the sequence is also
split: about PROGRAMS_PER_SM programs per SM, every split at least MIN_TILES
cache tiles long.  Each split keeps an online softmax in exp2 and writes its
unnormalised partial (acc, max, sum) to float32 scratch; a second kernel merges
the splits of each head in order, so the result is deterministic.  With one
split the first kernel writes the output itself.

The head blocks are the fastest-varying program id, so the programs that read
the same cache tile run side by side and all but the first read it from L2.

Tiles per shape: a program takes min(BLOCK_H, heads rounded up to a power of
two, at least 16) heads, with BLOCK_N-token tiles, or BLOCK_N_16-token tiles
when it takes 16.  On an H200 (2026-11-30, GPU us) 64-head blocks were fastest
for 128 heads at batch 16 and more (bs 64 x 8k: 848 against 2422 with 16-head
blocks), though ptxas reports spills for them (16-head blocks with 32-token
tiles: 149 registers, none), and 16-head blocks with 64-token tiles were fastest
for 16 heads (bs 64 x 8k: 255 against 392 with 32-token tiles and 507 with
64-head blocks).
Splits past a sequence's length (ragged batches are planned for the longest
sequence) store an empty partial and exit.  The plan (split count, scratch) is
built once per shape and kept.
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_H = 64  # knob: 16, 32, 64
BLOCK_N = 32  # knob: 16, 32, 64
BLOCK_N_16 = 64  # knob: 16, 32, 64
NUM_WARPS = 8  # knob: 4, 8
NUM_STAGES = 2  # knob: 1, 2, 3
PROGRAMS_PER_SM = 2  # knob: 1, 2, 4, 8
MIN_TILES = 4  # knob: 1, 2, 4, 8, 16
COMBINE_WARPS = 4  # knob: 2, 4, 8

LOG2E = 1.4426950408889634
EMPTY = tl.constexpr(-1.0e30)  # a split's running max before any key: finite, so empty splits merge to weight 0


@triton.jit
def _split_kernel(q_nope_ptr, q_pe_ptr, kv_ptr, out_ptr, part_ptr, ml_ptr, seqlens_ptr, table_ptr, table_stride,
                  qk_scale, NUM_HEADS: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr, PAGE: tl.constexpr,
                  SPLIT_LEN: tl.constexpr, SPLITS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                  DIRECT: tl.constexpr, DOT_F32: tl.constexpr):
    h_block = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2)
    seqlen = tl.load(seqlens_ptr + b)
    start = split * SPLIT_LEN
    end = tl.minimum(start + SPLIT_LEN, seqlen)

    offs_h = h_block * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < NUM_HEADS
    offs_r = tl.arange(0, RANK)
    offs_p = tl.arange(0, ROPE)
    rows_h = b.to(tl.int64) * NUM_HEADS + offs_h
    m_i = tl.full([BLOCK_H], EMPTY, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, RANK], dtype=tl.float32)
    if start < end:
        q_nope = tl.load(q_nope_ptr + rows_h[:, None] * RANK + offs_r[None, :], mask=mask_h[:, None], other=0.0)
        q_pe = tl.load(q_pe_ptr + rows_h[:, None] * ROPE + offs_p[None, :], mask=mask_h[:, None], other=0.0)
        if DOT_F32:  # Triton's CPU interpreter computes bf16 tl.dot wrongly
            q_nope = q_nope.to(tl.float32)
            q_pe = q_pe.to(tl.float32)
        offs_n = tl.arange(0, BLOCK_N)
        table_row = table_ptr + b.to(tl.int64) * table_stride
        # a fixed trip count (the split's tiles, masked past its end) lets Triton pipeline the
        # loads NUM_STAGES deep, and the CPU interpreter cannot loop to a loaded bound
        for i in tl.range(0, SPLIT_LEN // BLOCK_N):
            tok = start + i * BLOCK_N + offs_n
            mask_n = tok < end
            page = tl.load(table_row + tok // PAGE, mask=mask_n, other=0)
            row = (page.to(tl.int64) * PAGE + tok % PAGE) * (RANK + ROPE)
            c = tl.load(kv_ptr + row[:, None] + offs_r[None, :], mask=mask_n[:, None], other=0.0)
            k_pe = tl.load(kv_ptr + row[:, None] + RANK + offs_p[None, :], mask=mask_n[:, None], other=0.0)
            if DOT_F32:
                c = c.to(tl.float32)
                k_pe = k_pe.to(tl.float32)
            s = tl.dot(q_nope, tl.trans(c)) + tl.dot(q_pe, tl.trans(k_pe))  # (BLOCK_H, BLOCK_N), fp32
            s = tl.where(mask_n[None, :], s * qk_scale, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
            m_i = m_new
    if DIRECT:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + rows_h[:, None] * RANK + offs_r[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=mask_h[:, None])
    else:
        part_rows = rows_h * SPLITS + split  # (batch, head, split) rows of the scratch
        tl.store(part_ptr + part_rows[:, None] * RANK + offs_r[None, :], acc, mask=mask_h[:, None])
        tl.store(ml_ptr + part_rows * 2, m_i, mask=mask_h)
        tl.store(ml_ptr + part_rows * 2 + 1, l_i, mask=mask_h)


@triton.jit
def _combine_kernel(part_ptr, ml_ptr, out_ptr, RANK: tl.constexpr, SPLITS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # batch * num_heads + head
    offs_r = tl.arange(0, RANK)
    m = tl.full([1], EMPTY, dtype=tl.float32)
    for s in tl.range(0, SPLITS):
        m = tl.maximum(m, tl.load(ml_ptr + (row * SPLITS + s) * 2 + tl.zeros([1], dtype=tl.int32)))
    l_sum = tl.zeros([1], dtype=tl.float32)
    acc = tl.zeros([RANK], dtype=tl.float32)
    for s in tl.range(0, SPLITS):
        base = (row * SPLITS + s) * 2 + tl.zeros([1], dtype=tl.int32)
        w = tl.exp2(tl.load(ml_ptr + base) - m)
        l_sum += w * tl.load(ml_ptr + base + 1)
        acc += tl.sum(w[:, None] * tl.load(part_ptr + (row * SPLITS + s) * RANK + offs_r)[None, :], axis=0)
    l_tot = tl.sum(l_sum, axis=0)
    out = acc / tl.where(l_tot > 0, l_tot, 1.0)
    tl.store(out_ptr + row * RANK + offs_r, out.to(out_ptr.dtype.element_ty))


_PLANS = {}
_SMS = {}


def _sm_count(device):
    if device.type != "cuda":
        return 4  # the interpreter: a few splits, so the combine path is exercised
    if device.index not in _SMS:
        _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device.index]


def _plan(q_nope, batch, max_seqlen, heads, rank):
    block_h = min(BLOCK_H, max(16, triton.next_power_of_2(heads)))
    block_n = BLOCK_N_16 if block_h == 16 else BLOCK_N
    head_blocks = triton.cdiv(heads, block_h)
    tiles = max(1, triton.cdiv(max_seqlen, block_n))
    want = triton.cdiv(PROGRAMS_PER_SM * _sm_count(q_nope.device), batch * head_blocks)
    splits = max(1, min(want, tiles // MIN_TILES if tiles >= MIN_TILES else 1))
    split_len = triton.cdiv(tiles, splits) * block_n
    splits = triton.cdiv(max(max_seqlen, 1), split_len)  # no split starts past the longest sequence
    dev = q_nope.device
    rows = batch * heads * splits if splits > 1 else 1
    part = torch.empty((rows, rank), dtype=torch.float32, device=dev)
    ml = torch.empty((rows, 2), dtype=torch.float32, device=dev)
    return (head_blocks, splits, batch), split_len, splits, part, ml, block_h, block_n


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
    batch, seqlen, heads = int(batch_size), int(max_seqlen), int(num_heads)
    rank, rope, page = int(kv_lora_rank), int(qk_rope_dim), int(page_block_size)
    key = (q_nope.device, batch, seqlen, heads, rank, rope, page, block_table.stride(0))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _plan(q_nope, batch, seqlen, heads, rank)
        _PLANS[key] = plan
    grid, split_len, splits, part, ml, block_h, block_n = plan
    direct = splits == 1
    _split_kernel[grid](
        q_nope, q_pe, kv_cache, output, part, ml, cache_seqlens, block_table, block_table.stride(0),
        LOG2E / math.sqrt(rank + rope),
        NUM_HEADS=heads, RANK=rank, ROPE=rope, PAGE=page, SPLIT_LEN=split_len, SPLITS=splits,
        BLOCK_H=block_h, BLOCK_N=block_n, DIRECT=direct, DOT_F32=q_nope.device.type != "cuda",
        num_warps=NUM_WARPS, num_stages=NUM_STAGES,
    )
    if not direct:
        _combine_kernel[(batch * heads,)](part, ml, output, RANK=rank, SPLITS=splits, num_warps=COMBINE_WARPS)
