"""Fused MoE (SiLU-gated experts, top-k routing): grouped bf16 GEMMs with tiles chosen per shape.

Launches (all Triton, no host synchronisation, nothing computed by PyTorch):

1. routing, ``_route_count`` + ``_route_scatter``: the (token, k) pairs are
   grouped by expert (stable counting sort: per-chunk histograms, then every
   chunk places its pairs from the prefix sums) and each expert's group is
   padded to a multiple of BLOCK_M, so every BLOCK_M-slot row block belongs to
   one expert.  Only a per-expert table (padded end, end of the real rows) and
   the slot -> pair map are written; padding slots are recognised from the
   table, never from a sentinel, so nothing has to be cleared between calls.
   With a single chunk (decode-sized batches) the count launch is skipped.
2. ``_gate_up_kernel``: grid over (row block, BLOCK_N intermediate columns),
   gathers the blocks' token rows and multiplies them by the expert's gate and
   up rows with bf16 ``tl.dot`` (fp32 accumulation); silu(gate) * up is stored
   in bf16 per slot (padding slots get exact zeros).
3. ``_down_kernel``: grid over (row block, 2*BLOCK_N hidden columns, K split):
   the slots' activation rows (contiguous, no gather) times the expert's down
   projection, scaled by the pair's routing weight, stored per pair in fp32.
   With top_k == 1 and no K split it writes the bf16 output directly.
4. ``_combine_kernel``: each token's top_k x splits rows summed in a fixed
   order: deterministic, every output element written once.

Why per-shape tiles: with few rows per expert (decode) the kernel is bound by
reading the expert weights, so BLOCK_M is 16 (little padded work), BLOCK_K is
wide and the down projection is split along K until the grid fills the GPU.
With many rows per expert the GEMMs become compute bound and need big tiles
(64 or 128 rows, 8 warps) to reach tensor-core throughput.  Row blocks of the
same expert are numbered consecutively and the grid is swizzled in GROUP_M
groups of row blocks, so the blocks that share a weight tile run at the same
time and read it from L2.  All choices depend on shapes only (the average rows
per expert, num_tokens * top_k / min(num_experts, num_tokens * top_k)), so a
plan with its scratch buffers is built once per shape and reused.
"""

import torch
import triton
import triton.language as tl

SMALL_ROWS = 16  # knob: 0, 8, 16, 32, 64
LARGE_ROWS = 256  # knob: 0, 64, 128, 256, 512, 4096
SMALL_BLOCK_N = 64  # knob: 32, 64, 128
SMALL_BLOCK_K = 128  # knob: 64, 128, 256
SMALL_STAGES = 4  # knob: 2, 3, 4, 5
MAX_SPLIT_K = 4  # knob: 1, 2, 4, 8
MID_BLOCK_M = 64  # knob: 32, 64, 128
MID_BLOCK_N = 64  # knob: 32, 64, 128
MID_WARPS = 4  # knob: 4, 8
BIG_BLOCK_M = 128  # knob: 64, 128
BIG_BLOCK_N = 64  # knob: 32, 64, 128
BIG_WARPS = 8  # knob: 4, 8
BLOCK_K = 64  # knob: 32, 64, 128
STAGES = 3  # knob: 2, 3, 4
GROUP_M = 8  # knob: 1, 4, 8, 16, 32
ROUTE_CHUNK = 1024  # knob: 16, 256, 1024
COMBINE_WARPS = 4  # knob: 2, 4, 8


@triton.jit
def _route_count(ids_ptr, counts_ptr, NUM_PAIRS: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr):
    c = tl.program_id(0)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    # out-of-range slots get an id no expert column matches
    ids = tl.load(ids_ptr + offs, mask=offs < NUM_PAIRS, other=E_P2)
    hit = (ids[:, None] == tl.arange(0, E_P2)[None, :]).to(tl.int32)
    tl.store(counts_ptr + c * E_P2 + tl.arange(0, E_P2), tl.sum(hit, axis=0))


@triton.jit
def _route_scatter(ids_ptr, counts_ptr, pairs_ptr, pend_ptr, vend_ptr,
                   NUM_PAIRS: tl.constexpr, NUM_EXPERTS: tl.constexpr, E_P2: tl.constexpr,
                   CHUNK: tl.constexpr, NUM_CHUNKS: tl.constexpr, ROWS: tl.constexpr, BLOCK_M: tl.constexpr):
    c = tl.program_id(0)
    offs_e = tl.arange(0, E_P2)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < NUM_PAIRS, other=E_P2)
    hit = (ids[:, None] == offs_e[None, :]).to(tl.int32)
    if NUM_CHUNKS == 1:
        total = tl.sum(hit, axis=0)
        before = tl.zeros([E_P2], dtype=tl.int32)
    else:
        # every program re-derives the global prefix from the (small, L2-resident)
        # per-chunk histograms: cheaper than a third launch
        total = tl.zeros([E_P2], dtype=tl.int32)
        before = tl.zeros([E_P2], dtype=tl.int32)
        for r0 in range(0, NUM_CHUNKS, ROWS):
            rows = r0 + tl.arange(0, ROWS)
            tile = tl.load(counts_ptr + rows[:, None] * E_P2 + offs_e[None, :],
                           mask=(rows < NUM_CHUNKS)[:, None], other=0)
            total += tl.sum(tile, axis=0)
            before += tl.sum(tl.where((rows < c)[:, None], tile, 0), axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pend = tl.cumsum(padded, axis=0)
    pstart = pend - padded
    # rank of each pair among the chunk's pairs of its expert: stable, so slots are deterministic
    rank = tl.cumsum(hit, axis=0) - 1
    slot = tl.sum(hit * (pstart + before)[None, :] + hit * rank, axis=1)
    tl.store(pairs_ptr + slot, offs, mask=offs < NUM_PAIRS)
    if c == 0:
        e_ok = offs_e < NUM_EXPERTS
        tl.store(pend_ptr + offs_e, pend, mask=e_ok)
        tl.store(vend_ptr + offs_e, pstart + total, mask=e_ok)


@triton.jit
def _grouped_tile(pid, NUM_M: tl.constexpr, NUM_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column block) of a program. GROUP_M consecutive row blocks (mostly of one
    expert) sweep the N tiles together, so each weight tile is fetched from HBM once per
    group and their rows stay in L2."""
    first = (pid // (GROUP_M * NUM_N)) * GROUP_M
    size = tl.minimum(NUM_M - first, GROUP_M)
    return first + (pid % (GROUP_M * NUM_N)) % size, (pid % (GROUP_M * NUM_N)) // size


@triton.jit
def _expert_of(row0, pend_ptr, NUM_EXPERTS: tl.constexpr, E_P2: tl.constexpr):
    """The expert of the row block at row0: how many padded expert ranges end at or before
    it (NUM_EXPERTS: an unused block)."""
    offs_e = tl.arange(0, E_P2)
    pend = tl.load(pend_ptr + offs_e, mask=offs_e < NUM_EXPERTS, other=2147483647)
    return tl.sum((pend <= row0).to(tl.int32), axis=0)


@triton.jit
def _gate_up_kernel(x_ptr, w13_ptr, pairs_ptr, pend_ptr, vend_ptr, act_ptr, x_stride,
                    NUM_EXPERTS: tl.constexpr, E_P2: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                    TOP_K: tl.constexpr, NUM_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, DOT_F32: tl.constexpr):
    NUM_N: tl.constexpr = (INTER + BLOCK_N - 1) // BLOCK_N
    EVEN_K: tl.constexpr = HIDDEN % BLOCK_K == 0
    pid_m, pid_n = _grouped_tile(tl.program_id(0), NUM_M, NUM_N, GROUP_M)
    row0 = pid_m * BLOCK_M
    expert = _expert_of(row0, pend_ptr, NUM_EXPERTS, E_P2)
    if expert >= NUM_EXPERTS:
        return
    vend = tl.load(vend_ptr + expert)
    slots = row0 + tl.arange(0, BLOCK_M)
    valid = slots < vend
    pairs = tl.load(pairs_ptr + slots, mask=valid, other=0)
    x_rows = x_ptr + (pairs // TOP_K).to(tl.int64)[:, None] * x_stride
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # wrap the columns past INTER onto real rows: loads stay in bounds, their results are never stored
    w_rows = offs_n % INTER
    offs_k = tl.arange(0, BLOCK_K)
    w_base = w13_ptr + expert.to(tl.int64) * (2 * INTER * HIDDEN)
    g_ptrs = w_base + w_rows[:, None] * HIDDEN + offs_k[None, :]
    u_ptrs = g_ptrs + INTER * HIDDEN
    x_ptrs = x_rows + offs_k[None, :]

    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=valid[:, None], other=0.0)
            wg = tl.load(g_ptrs)
            wu = tl.load(u_ptrs)
        else:
            k_ok = (k0 + offs_k) < HIDDEN
            x = tl.load(x_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(g_ptrs, mask=k_ok[None, :], other=0.0)
            wu = tl.load(u_ptrs, mask=k_ok[None, :], other=0.0)
        if DOT_F32:  # the CPU interpreter's bf16 dot is unreliable; GPUs take the bf16 path
            x = x.to(tl.float32)
            wg = wg.to(tl.float32)
            wu = wu.to(tl.float32)
        gate = tl.dot(x, tl.trans(wg), gate)
        up = tl.dot(x, tl.trans(wu), up)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    act = gate / (1.0 + tl.exp(-gate)) * up
    # every slot of the block is written (padding rows: silu(0) * 0 = 0), so the down
    # projection reads whole row blocks without masks
    out = act_ptr + slots.to(tl.int64)[:, None] * INTER + offs_n[None, :]
    tl.store(out, act.to(act_ptr.dtype.element_ty), mask=(offs_n < INTER)[None, :])


@triton.jit
def _down_kernel(act_ptr, w2_ptr, weights_ptr, pairs_ptr, pend_ptr, vend_ptr, part_ptr, out_ptr, out_stride,
                 NUM_PAIRS: tl.constexpr, NUM_EXPERTS: tl.constexpr, E_P2: tl.constexpr, HIDDEN: tl.constexpr,
                 INTER: tl.constexpr, TOP_K: tl.constexpr, NUM_M: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_ITERS: tl.constexpr, EVEN_K: tl.constexpr,
                 GROUP_M: tl.constexpr, DIRECT: tl.constexpr, DOT_F32: tl.constexpr):
    NUM_N: tl.constexpr = (HIDDEN + BLOCK_N - 1) // BLOCK_N
    pid_m, pid_n = _grouped_tile(tl.program_id(0), NUM_M, NUM_N, GROUP_M)
    split = tl.program_id(1)
    row0 = pid_m * BLOCK_M
    expert = _expert_of(row0, pend_ptr, NUM_EXPERTS, E_P2)
    if expert >= NUM_EXPERTS:
        return
    vend = tl.load(vend_ptr + expert)
    slots = row0 + tl.arange(0, BLOCK_M)
    valid = slots < vend
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = offs_n % HIDDEN
    k_first = split * (K_ITERS * BLOCK_K)
    offs_k = k_first + tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + slots.to(tl.int64)[:, None] * INTER + offs_k[None, :]
    w_ptrs = w2_ptr + expert.to(tl.int64) * (HIDDEN * INTER) + w_rows[:, None] * INTER + offs_k[None, :]

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for it in range(K_ITERS):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_ok = (offs_k + it * BLOCK_K) < INTER
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
        if DOT_F32:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(a, tl.trans(w), acc)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    pairs = tl.load(pairs_ptr + slots, mask=valid, other=0)
    weight = tl.load(weights_ptr + pairs, mask=valid, other=0.0)
    acc = acc * weight[:, None]
    n_ok = (offs_n < HIDDEN)[None, :]
    if DIRECT:  # top-1 without a K split: the pair is the token, write the answer
        dst = out_ptr + pairs.to(tl.int64)[:, None] * out_stride + offs_n[None, :]
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_ok)
    else:
        rows = split.to(tl.int64) * NUM_PAIRS + pairs.to(tl.int64)
        tl.store(part_ptr + rows[:, None] * HIDDEN + offs_n[None, :], acc, mask=valid[:, None] & n_ok)


@triton.jit
def _combine_kernel(part_ptr, out_ptr, out_stride, NUM_PAIRS: tl.constexpr, HIDDEN: tl.constexpr,
                    TOP_K: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < HIDDEN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        for j in tl.static_range(TOP_K):
            row = s * NUM_PAIRS + token * TOP_K + j
            acc += tl.load(part_ptr + row * HIDDEN + offs, mask=ok, other=0.0)
    tl.store(out_ptr + token * out_stride + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


_SMS = {}
_PLANS = {}


def _sm_count(device):
    key = (device.type, device.index)
    if key not in _SMS:
        # CPU / interpreter runs plan as for an H200
        _SMS[key] = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    return _SMS[key]


def _cdiv(a, b):
    return -(-a // b)


def _tiles(rows_per_expert):
    """(BLOCK_M, BLOCK_N of gate/up, BLOCK_K, warps, stages) for an average number of rows per expert."""
    if rows_per_expert > LARGE_ROWS:
        return BIG_BLOCK_M, BIG_BLOCK_N, BLOCK_K, BIG_WARPS, STAGES
    if rows_per_expert > SMALL_ROWS:
        return MID_BLOCK_M, MID_BLOCK_N, BLOCK_K, MID_WARPS, STAGES
    return 16, SMALL_BLOCK_N, SMALL_BLOCK_K, 4, SMALL_STAGES


def _make_plan(x, out, tokens, hidden, inter, experts, top_k):
    dev = x.device
    interp = dev.type != "cuda"
    num_pairs = tokens * top_k
    e_p2 = triton.next_power_of_2(experts)
    block_m, block_n, block_k, warps, stages = _tiles(num_pairs / min(experts, num_pairs))
    # the pipeline keeps up to `stages` tiles of A and of both B operands in shared memory
    # (the down kernel's are the same size: twice BLOCK_N, one operand); a launch that
    # asks for more than the SM has fails, so stay within 200 KiB whatever the knobs say
    stage_bytes = (block_m + 2 * block_n) * block_k * x.element_size()
    stages = max(2, min(stages, 200 * 1024 // stage_bytes))
    # the number of row blocks is data dependent; launch the bound (every active expert
    # wastes at most BLOCK_M - 1 slots) and let the blocks past the end exit at once,
    # instead of synchronising with the host to read the count
    num_m = _cdiv(num_pairs + min(experts, num_pairs) * (block_m - 1), block_m)
    # pairs per routing program; the chunk x experts one-hot tile is kept within 8192 elements
    chunk = max(16, min(ROUTE_CHUNK, 8192 // e_p2, triton.next_power_of_2(num_pairs)))
    num_chunks = _cdiv(num_pairs, chunk)
    rows = min(triton.next_power_of_2(num_chunks), max(1, 4096 // e_p2))

    down_n = 2 * block_n  # one accumulator, as many fp32 registers as gate + up
    k_tiles = _cdiv(inter, block_k)
    programs = num_m * _cdiv(hidden, down_n)
    # split K only as far as needed for about two programs per SM: every split adds a
    # partial row per pair for the combine kernel to read
    split = max(1, min(MAX_SPLIT_K, k_tiles, _cdiv(2 * _sm_count(dev), programs)))
    k_iters = _cdiv(k_tiles, split)
    split = _cdiv(k_tiles, k_iters)  # no empty split
    even_k = inter % block_k == 0 and split * k_iters == k_tiles
    direct = top_k == 1 and split == 1

    i32 = torch.int32
    bufs = dict(
        counts=torch.empty(num_chunks * e_p2, dtype=i32, device=dev),
        pairs=torch.empty(num_m * block_m, dtype=i32, device=dev),
        pend=torch.empty(e_p2, dtype=i32, device=dev),
        vend=torch.empty(e_p2, dtype=i32, device=dev),
        act=torch.empty((num_m * block_m, inter), dtype=x.dtype, device=dev),
        part=torch.empty(1 if direct else split * num_pairs * hidden, dtype=torch.float32, device=dev),
    )
    combine_block = min(1024, triton.next_power_of_2(hidden))
    route_kw = dict(NUM_PAIRS=num_pairs, E_P2=e_p2, CHUNK=chunk)
    scatter_kw = dict(route_kw, NUM_EXPERTS=experts, NUM_CHUNKS=num_chunks, ROWS=rows, BLOCK_M=block_m)
    common = dict(NUM_EXPERTS=experts, E_P2=e_p2, HIDDEN=hidden, INTER=inter, TOP_K=top_k, NUM_M=num_m,
                  BLOCK_M=block_m, GROUP_M=GROUP_M, DOT_F32=interp, num_warps=warps, num_stages=stages)
    gate_kw = dict(common, BLOCK_N=block_n, BLOCK_K=block_k)
    down_kw = dict(common, NUM_PAIRS=num_pairs, BLOCK_N=down_n, BLOCK_K=block_k, K_ITERS=k_iters,
                   EVEN_K=even_k, DIRECT=direct)
    comb_kw = dict(NUM_PAIRS=num_pairs, HIDDEN=hidden, TOP_K=top_k, SPLITS=split, BLOCK=combine_block,
                   num_warps=COMBINE_WARPS)
    grids = dict(route=(num_chunks,), gate=(num_m * _cdiv(inter, block_n),), down=(num_m * _cdiv(hidden, down_n), split),
                 comb=(tokens, _cdiv(hidden, combine_block)))
    return bufs, grids, route_kw, scatter_kw, gate_kw, down_kw, comb_kw, direct


def run_kernel(
    hidden_states,
    w13,
    w2,
    topk_weights,
    topk_ids,
    output,
    num_tokens,
    hidden_size,
    intermediate_size,
    num_experts,
    top_k,
):
    tokens, hidden, inter = int(num_tokens), int(hidden_size), int(intermediate_size)
    experts, k = int(num_experts), int(top_k)
    key = (hidden_states.device, hidden_states.dtype, w13.dtype, tokens, hidden, inter, experts, k,
           hidden_states.stride(0), output.stride(0))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(hidden_states, output, tokens, hidden, inter, experts, k)
        _PLANS[key] = plan
    bufs, grids, route_kw, scatter_kw, gate_kw, down_kw, comb_kw, direct = plan
    ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
    weights = topk_weights if topk_weights.is_contiguous() else topk_weights.contiguous()
    if scatter_kw["NUM_CHUNKS"] > 1:
        _route_count[grids["route"]](ids, bufs["counts"], **route_kw)
    _route_scatter[grids["route"]](ids, bufs["counts"], bufs["pairs"], bufs["pend"], bufs["vend"], **scatter_kw)
    _gate_up_kernel[grids["gate"]](hidden_states, w13, bufs["pairs"], bufs["pend"], bufs["vend"], bufs["act"],
                                   hidden_states.stride(0), **gate_kw)
    _down_kernel[grids["down"]](bufs["act"], w2, weights, bufs["pairs"], bufs["pend"], bufs["vend"], bufs["part"],
                                output, output.stride(0), **down_kw)
    if not direct:
        _combine_kernel[grids["comb"]](bufs["part"], output, output.stride(0), **comb_kw)
