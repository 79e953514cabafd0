"""optagent hooks for the MLA decode task (see docs/task-format.md).

The argument list of ``run_kernel`` (and of every function here) is::

    0 q_nope         bf16 (batch, num_heads, kv_lora_rank)
    1 q_pe           bf16 (batch, num_heads, qk_rope_dim)
    2 kv_cache       bf16 (num_blocks, page_block_size, kv_lora_rank + qk_rope_dim)
    3 output         bf16 (batch, num_heads, kv_lora_rank)                 <- written
    4 cache_seqlens  int32 (batch,)
    5 block_table    int32 (batch, num_blocks // batch)
    6.. batch_size, max_seqlen, num_heads, kv_lora_rank, qk_rope_dim,
        page_block_size, num_blocks   (ints)

Token ``t`` of sequence ``b`` is row ``t % page_block_size`` of page
``block_table[b, t // page_block_size]``; its first ``kv_lora_rank`` values are
the latent vector c (key part and value), the last ``qk_rope_dim`` the rotary
key k_pe.  For every head h::

    score_t = (q_nope[b, h] . c_t + q_pe[b, h] . k_pe_t) / sqrt(kv_lora_rank + qk_rope_dim)
    output[b, h] = sum_t softmax(score)_t * c_t

Case parameters understood by ``make_case`` (the ``[[smoke]]``/``[[hidden]]``
tables of optagent.toml):

* ``batch_size``; ``seqlen`` (every sequence that long) or ``seqlens`` (a list,
  one length per sequence, each at least 1);
* ``num_heads`` (16), ``kv_lora_rank`` (512), ``qk_rope_dim`` (64),
  ``page_block_size`` (64);
* ``num_blocks`` (the pool size) or ``spare`` (3): the pool holds ``spare``
  times the pages the longest sequence needs, per sequence, and the block table
  is a random permutation of it, so most pages belong to nobody;
* ``garbage`` (0 = off): every cache row no sequence may read (unused pages and
  the tails of last pages) holds a row of norm ``(garbage/2 .. garbage) *
  sqrt(kv_lora_rank + qk_rope_dim)`` pointing along the normalised sum of the
  query directions (of the page's own sequence for the tail of its last page,
  of all sequences for unused pages).  Such a row scores hugely *positive* for
  every head and, being also the value, drags the output far off: reading past
  ``cache_seqlens`` or through a wrong block-table entry is caught.

``output`` is created filled with NaN, so a kernel that leaves part of it
unwritten fails.
"""

from __future__ import annotations

import math

import torch

Q_NOPE, Q_PE, KV_CACHE, OUTPUT, SEQLENS, BLOCK_TABLE = range(6)
BATCH, MAX_SEQLEN, HEADS, RANK, ROPE, PAGE, NUM_BLOCKS = range(6, 13)


def _lengths(params: dict) -> list[int]:
    batch = int(params["batch_size"])
    if "seqlens" in params:
        lengths = [int(n) for n in params["seqlens"]]
        if len(lengths) != batch:
            raise ValueError(f"seqlens has {len(lengths)} entries for batch_size {batch}")
    else:
        lengths = [int(params["seqlen"])] * batch
    if min(lengths) < 1:
        raise ValueError("every sequence needs at least one cached token")
    return lengths


def make_case(params: dict, device: str, seed: int) -> list:
    """The run_kernel argument list for one manifest case, deterministic in ``seed``."""
    lengths = _lengths(params)
    batch = len(lengths)
    heads = int(params.get("num_heads", 16))
    rank = int(params.get("kv_lora_rank", 512))
    rope = int(params.get("qk_rope_dim", 64))
    page = int(params.get("page_block_size", 64))
    garbage = float(params.get("garbage", 0.0))
    width = rank + rope
    pages_needed = math.ceil(max(lengths) / page)
    if "num_blocks" in params:
        num_blocks = int(params["num_blocks"])
    else:
        num_blocks = batch * pages_needed * int(params.get("spare", 3))
    per_seq = num_blocks // batch
    if per_seq < pages_needed:
        raise ValueError(f"num_blocks {num_blocks} leaves {per_seq} pages per sequence, {pages_needed} needed")

    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    bf16 = torch.bfloat16
    q_nope = torch.randn(batch, heads, rank, dtype=bf16, device=device, generator=gen)
    q_pe = torch.randn(batch, heads, rope, dtype=bf16, device=device, generator=gen)
    kv_cache = torch.randn(num_blocks, page, width, dtype=bf16, device=device, generator=gen)
    perm = torch.randperm(num_blocks, device=device, generator=gen).to(torch.int32)
    block_table = perm[: batch * per_seq].reshape(batch, per_seq).contiguous()
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)

    if garbage:
        readable = torch.zeros(num_blocks, page, dtype=torch.bool, device=device)
        slots = torch.arange(page, device=device)
        for b, n in enumerate(lengths):
            used = block_table[b, : math.ceil(n / page)].long()
            limit = torch.full((used.numel(),), page, device=device)
            limit[-1] = n - page * (used.numel() - 1)
            readable[used] |= slots[None, :] < limit[:, None]
        q = torch.cat([q_nope, q_pe], dim=-1).float()
        unit = q / q.norm(dim=-1, keepdim=True)
        per_seq_dir = unit.sum(dim=1)
        per_seq_dir = per_seq_dir / per_seq_dir.norm(dim=-1, keepdim=True)  # (batch, width)
        pooled = per_seq_dir.sum(dim=0)
        pooled = pooled / pooled.norm()
        direction = pooled.expand(num_blocks, page, width).clone()
        for b, n in enumerate(lengths):
            direction[int(block_table[b, math.ceil(n / page) - 1])] = per_seq_dir[b]
        size = torch.rand(num_blocks, page, 1, device=device, generator=gen) * 0.5 + 0.5
        noise = (garbage * math.sqrt(width)) * size * direction
        kv_cache.copy_(torch.where(readable[:, :, None], kv_cache, noise.to(bf16)))

    output = torch.full((batch, heads, rank), math.nan, dtype=bf16, device=device)
    return [q_nope, q_pe, kv_cache, output, cache_seqlens, block_table, batch, max(lengths), heads, rank, rope,
            page, num_blocks]


def reference(args: list, dtype: torch.dtype) -> list:
    """``[output]`` computed with plain PyTorch entirely in ``dtype``; ``args`` is left untouched."""
    q_nope, q_pe, kv_cache = args[Q_NOPE], args[Q_PE], args[KV_CACHE]
    rank, rope = int(args[RANK]), int(args[ROPE])
    page = kv_cache.shape[1]
    scale = 1.0 / math.sqrt(rank + rope)
    q = torch.cat([q_nope, q_pe], dim=-1).to(dtype)  # (batch, heads, width)
    out = torch.zeros(q_nope.shape, dtype=dtype, device=q_nope.device)
    for b, n in enumerate(args[SEQLENS].tolist()):
        n = int(n)
        if n <= 0:
            continue
        pages = args[BLOCK_TABLE][b, : math.ceil(n / page)].long()
        rows = kv_cache[pages].reshape(-1, kv_cache.shape[-1])[:n].to(dtype)  # (n, width)
        weights = torch.softmax(torch.matmul(q[b], rows.t()) * scale, dim=-1)  # (heads, n)
        out[b] = torch.matmul(weights, rows[:, :rank])
    return [out]


def _tokens(args: list) -> list[int]:
    return [int(n) for n in args[SEQLENS].tolist()]


def bytes_moved(args: list) -> int:
    """The queries, each sequence's cache rows (once, shared by all heads), its block-table entries, the output."""
    q_nope, q_pe, kv_cache, out = args[Q_NOPE], args[Q_PE], args[KV_CACHE], args[OUTPUT]
    page = kv_cache.shape[1]
    lengths = _tokens(args)
    rows = sum(lengths) * kv_cache.shape[-1] * kv_cache.element_size()
    table = args[BLOCK_TABLE].element_size() * sum(math.ceil(n / page) for n in lengths)
    seqlens = args[SEQLENS].numel() * args[SEQLENS].element_size()
    queries = q_nope.numel() * q_nope.element_size() + q_pe.numel() * q_pe.element_size()
    return int(queries + rows + table + seqlens + out.numel() * out.element_size())


def flops(args: list) -> int:
    """Per head and cached token: 2*(rank + rope) for the score and 2*rank for the weighted latent row."""
    heads, rank, rope = int(args[HEADS]), int(args[RANK]), int(args[ROPE])
    return 2 * (2 * rank + rope) * heads * sum(_tokens(args))


def describe(args: list) -> str:
    lengths = _tokens(args)
    if len(set(lengths)) == 1:
        seqlen = str(lengths[0])
    elif len(lengths) <= 4:
        seqlen = "[" + ",".join(map(str, lengths)) + "]"
    else:
        seqlen = f"{min(lengths)}..{max(lengths)}"
    return (f"bs={len(lengths)} seqlen={seqlen} h={int(args[HEADS])} d={int(args[RANK])}+{int(args[ROPE])} "
            f"page={int(args[PAGE])}")
