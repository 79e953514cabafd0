"""Fused mixture-of-experts (SiLU-gated MLP experts, top-k routing) in Triton: a simple, correct start.

A grouped GEMM over experts, in three launches after a routing step:

0. routing (PyTorch, on the device, no host synchronisation): the token-expert
   pairs (pair p = token * top_k + j) are sorted by expert and each expert's
   list is padded to a multiple of BLOCK_M with the invalid index
   num_tokens * top_k, so that every block of BLOCK_M sorted slots belongs to
   one expert (``block_expert``; num_experts marks blocks past the end).
1. gate/up: one program per (block of slots, BLOCK_N intermediate columns):
   gathers the slots' token rows, multiplies them by the expert's gate and up
   rows with tl.dot, and stores silu(gate) * up per pair in a float32 workspace.
2. down: one program per (block of slots, BLOCK_N hidden columns): activation
   rows times the expert's down projection, scaled by each pair's routing weight,
   stored per pair in a float32 workspace.
3. combine: one program per (token, BLOCK_N hidden columns) adds the token's
   top_k rows and writes the bf16 output; each element is written once.

Tiles are converted to float32 before tl.dot: on the GPU that is a TF32 product
(exact for bf16 inputs), and Triton's CPU interpreter computes bf16 tl.dot wrongly.
"""

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # knob: 16, 32, 64
BLOCK_N = 64  # knob: 32, 64, 128
BLOCK_K = 64  # knob: 32, 64, 128


@triton.jit
def _gate_up_kernel(
    x_ptr,
    w13_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    act_ptr,
    NUM_PAIRS: tl.constexpr,
    NUM_EXPERTS: tl.constexpr,
    HIDDEN: tl.constexpr,
    INTER: tl.constexpr,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    n_block = tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert >= NUM_EXPERTS:
        return
    pairs = tl.load(sorted_ids_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < NUM_PAIRS
    tokens = (pairs // TOP_K).to(tl.int64)
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < INTER
    offs_k = tl.arange(0, BLOCK_K)
    w_base = w13_ptr + expert.to(tl.int64) * (2 * INTER * HIDDEN)

    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        cols = k0 + offs_k
        mask_k = cols < HIDDEN
        x = tl.load(x_ptr + tokens[:, None] * HIDDEN + cols[None, :], mask=valid[:, None] & mask_k[None, :], other=0.0)
        w_mask = mask_k[:, None] & mask_n[None, :]
        w_gate = tl.load(w_base + offs_n[None, :] * HIDDEN + cols[:, None], mask=w_mask, other=0.0)
        w_up = tl.load(w_base + (offs_n[None, :] + INTER) * HIDDEN + cols[:, None], mask=w_mask, other=0.0)
        x = x.to(tl.float32)
        gate += tl.dot(x, w_gate.to(tl.float32))
        up += tl.dot(x, w_up.to(tl.float32))
    act = gate / (1.0 + tl.exp(-gate)) * up  # silu(gate) * up
    out = act_ptr + pairs.to(tl.int64)[:, None] * INTER + offs_n[None, :]
    tl.store(out, act, mask=valid[:, None] & mask_n[None, :])


@triton.jit
def _down_kernel(
    act_ptr,
    w2_ptr,
    weights_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    part_ptr,
    NUM_PAIRS: tl.constexpr,
    NUM_EXPERTS: tl.constexpr,
    HIDDEN: tl.constexpr,
    INTER: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    n_block = tl.program_id(1)
    expert = tl.load(block_expert_ptr + block)
    if expert >= NUM_EXPERTS:
        return
    pairs = tl.load(sorted_ids_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < NUM_PAIRS
    rows = pairs.to(tl.int64)
    offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < HIDDEN
    offs_k = tl.arange(0, BLOCK_K)
    w_base = w2_ptr + expert.to(tl.int64) * (HIDDEN * INTER)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        cols = k0 + offs_k
        mask_k = cols < INTER
        a = tl.load(act_ptr + rows[:, None] * INTER + cols[None, :], mask=valid[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_base + offs_n[None, :] * INTER + cols[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc += tl.dot(a, w.to(tl.float32))
    weight = tl.load(weights_ptr + rows, mask=valid, other=0.0)
    acc = acc * weight[:, None]
    tl.store(part_ptr + rows[:, None] * HIDDEN + offs_n[None, :], acc, mask=valid[:, None] & mask_n[None, :])


@triton.jit
def _combine_kernel(
    part_ptr,
    out_ptr,
    HIDDEN: tl.constexpr,
    TOP_K: tl.constexpr,
    TOP_K_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_j = tl.arange(0, TOP_K_P2)
    mask = (offs_j < TOP_K)[:, None] & (offs_n < HIDDEN)[None, :]
    rows = token * TOP_K + offs_j
    part = tl.load(part_ptr + rows[:, None] * HIDDEN + offs_n[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + token * HIDDEN + offs_n, tl.sum(part, axis=0).to(out_ptr.dtype.element_ty), mask=offs_n < HIDDEN)


def _sort_pairs(topk_ids, num_experts, block_m):
    """Pair indices grouped by expert, each group padded to block_m; and each block's expert."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)  # pairs, grouped by expert
    experts = flat[order]
    rank = torch.arange(num_pairs, device=device) - (torch.cumsum(counts, 0) - counts)[experts]
    # Blocks in use: sum over experts of ceil(count / block_m), at most this (known without a sync).
    max_blocks = triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m)
    sorted_ids = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids[(padded_end - padded)[experts] + rank] = order.to(torch.int32)
    starts = torch.arange(max_blocks, device=device) * block_m
    block_expert = torch.searchsorted(padded_end, starts, right=True).to(torch.int32)  # num_experts: unused
    return sorted_ids, block_expert, max_blocks


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
    experts, top_k = int(num_experts), int(top_k)
    num_pairs = tokens * top_k
    sorted_ids, block_expert, max_blocks = _sort_pairs(topk_ids, experts, BLOCK_M)
    device = hidden_states.device
    act = torch.empty((num_pairs, inter), dtype=torch.float32, device=device)
    part = torch.empty((num_pairs, hidden), dtype=torch.float32, device=device)
    tiles = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    _gate_up_kernel[(max_blocks, triton.cdiv(inter, BLOCK_N))](
        hidden_states, w13, sorted_ids, block_expert, act,
        NUM_PAIRS=num_pairs, NUM_EXPERTS=experts, HIDDEN=hidden, INTER=inter, TOP_K=top_k, **tiles,
        num_warps=4, num_stages=2,
    )
    _down_kernel[(max_blocks, triton.cdiv(hidden, BLOCK_N))](
        act, w2, topk_weights, sorted_ids, block_expert, part,
        NUM_PAIRS=num_pairs, NUM_EXPERTS=experts, HIDDEN=hidden, INTER=inter, **tiles,
        num_warps=4, num_stages=2,
    )
    _combine_kernel[(tokens, triton.cdiv(hidden, BLOCK_N))](
        part, output, HIDDEN=hidden, TOP_K=top_k, TOP_K_P2=triton.next_power_of_2(top_k), BLOCK_N=BLOCK_N,
        num_warps=4,
    )
