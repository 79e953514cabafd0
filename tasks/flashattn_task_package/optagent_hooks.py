"""optagent hooks for the paged KV-cache decode task (see docs/task-format.md).

The argument list of ``run_kernel`` (and of every function here) is::

    0 q              bf16 (batch, seqlen_q, num_heads, headdim)
    1 k_cache_paged  bf16 (num_blocks, page_block_size, num_heads_k, headdim)
    2 v_cache_paged  bf16 (num_blocks, page_block_size, num_heads_k, headdim)
    3 output         bf16 (batch, seqlen_q, num_heads, headdim)        <- written
    4 cache_seqlens  int32 (batch,)
    5 block_table    int32 (batch, num_blocks // batch)
    6.. batch_size, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim,
        page_block_size, num_blocks, causal   (ints)

Case parameters understood by ``make_case`` (the ``[[smoke]]``/``[[hidden]]``
tables of optagent.toml):

* ``batch_size``; ``seqlen_k`` (every sequence that long) or ``seqlens`` (a
  list, one length per sequence; ``seqlen_k`` is then their maximum);
* ``num_heads`` (8), ``num_heads_k`` (= num_heads), ``headdim`` (128),
  ``page_block_size`` (16), ``seqlen_q`` (1), ``causal`` (0);
* ``num_blocks`` (the pool size) or ``spare`` (3): the pool holds ``spare``
  times the pages the longest sequence needs, per sequence, so the block table
  is a random permutation of a pool mostly made of pages nobody reads;
* ``garbage`` (0 = off): every K/V slot that no sequence may read (unused pages
  and the tails of the last pages) is filled with large finite values, so a
  kernel that reads past ``cache_seqlens`` or follows the wrong block-table
  entry gets a wildly wrong answer.  V slots get magnitude ``garbage/2 ..
  garbage`` with random signs.  K slots get rows of norm ``(garbage/2 ..
  garbage) * sqrt(headdim)`` pointing along the (normalised) sum of the query
  directions of the KV head's query heads -- those of the page's own sequence
  for the tail of its last page, of all sequences for unused pages -- so that
  a garbage key scores hugely *positive* and dominates the softmax: with random
  signs half the garbage keys would score hugely negative and a single token
  read past the end would go unnoticed with probability 2^-(query heads).

``output`` is created filled with NaN, so a kernel that leaves part of it
unwritten fails.
"""

from __future__ import annotations

import math

import torch

Q, K_CACHE, V_CACHE, OUTPUT, SEQLENS, BLOCK_TABLE = range(6)
(BATCH, SEQLEN_K, SEQLEN_Q, HEADS, HEADS_K, HEADDIM, PAGE, NUM_BLOCKS, CAUSAL) = range(6, 15)


def _lengths(params: dict) -> list[int]:
    batch = int(params["batch_size"])
    if "seqlens" in params:
        lengths = [int(n) for n in params["seqlens"]]
        if len(lengths) != batch:
            raise ValueError(f"seqlens has {len(lengths)} entries for batch_size {batch}")
    else:
        lengths = [int(params["seqlen_k"])] * batch
    if min(lengths) < 1:
        raise ValueError("every sequence needs at least one cached token")
    return lengths


def make_case(params: dict, device: str, seed: int) -> list:
    """The run_kernel argument list for one manifest case, deterministic in ``seed``."""
    lengths = _lengths(params)
    batch = len(lengths)
    heads = int(params.get("num_heads", 8))
    heads_k = int(params.get("num_heads_k", heads))
    headdim = int(params.get("headdim", 128))
    page = int(params.get("page_block_size", 16))
    seqlen_q = int(params.get("seqlen_q", 1))
    causal = int(params.get("causal", 0))
    garbage = float(params.get("garbage", 0.0))
    if heads % heads_k:
        raise ValueError(f"num_heads {heads} is not a multiple of num_heads_k {heads_k}")
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
    q = torch.randn(batch, seqlen_q, heads, headdim, dtype=bf16, device=device, generator=gen)
    k_cache = torch.randn(num_blocks, page, heads_k, headdim, dtype=bf16, device=device, generator=gen)
    v_cache = torch.randn(num_blocks, page, heads_k, headdim, dtype=bf16, device=device, generator=gen)
    perm = torch.randperm(num_blocks, device=device, generator=gen).to(torch.int32)
    block_table = perm[: batch * per_seq].reshape(batch, per_seq).contiguous()
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)

    if garbage:
        # readable[p, s] is True for the slots some sequence may legitimately read.
        readable = torch.zeros(num_blocks, page, dtype=torch.bool, device=device)
        slots = torch.arange(page, device=device)
        for b, n in enumerate(lengths):
            used = block_table[b, : math.ceil(n / page)].long()
            limit = torch.full((used.numel(),), page, device=device)
            limit[-1] = n - page * (used.numel() - 1)
            readable[used] |= slots[None, :] < limit[:, None]
        # K: aim every garbage key at the queries that could wrongly read it.
        unit_q = q.float() / q.float().norm(dim=-1, keepdim=True)
        groups = heads // heads_k
        per_seq = unit_q.reshape(batch, seqlen_q, heads_k, groups, headdim).sum(dim=(1, 3))
        per_seq = per_seq / per_seq.norm(dim=-1, keepdim=True)  # (batch, heads_k, D)
        pooled = per_seq.sum(dim=0)
        pooled = pooled / pooled.norm(dim=-1, keepdim=True)  # (heads_k, D)
        direction = pooled.expand(num_blocks, page, heads_k, headdim).clone()
        for b, n in enumerate(lengths):
            direction[int(block_table[b, math.ceil(n / page) - 1])] = per_seq[b]
        scale = torch.rand(num_blocks, page, 1, 1, device=device, generator=gen) * 0.5 + 0.5
        k_noise = (garbage * math.sqrt(headdim)) * scale * direction
        # V: large values of random sign.
        magnitude = torch.rand(v_cache.shape, device=device, generator=gen) * 0.5 + 0.5
        sign = torch.randint(0, 2, v_cache.shape, device=device, generator=gen) * 2 - 1
        v_noise = garbage * magnitude * sign
        keep = readable[:, :, None, None]
        k_cache.copy_(torch.where(keep, k_cache, k_noise.to(bf16)))
        v_cache.copy_(torch.where(keep, v_cache, v_noise.to(bf16)))

    output = torch.full((batch, seqlen_q, heads, headdim), math.nan, dtype=bf16, device=device)
    return [
        q,
        k_cache,
        v_cache,
        output,
        cache_seqlens,
        block_table,
        batch,
        max(lengths),
        seqlen_q,
        heads,
        heads_k,
        headdim,
        page,
        num_blocks,
        causal,
    ]


def reference(args: list, dtype: torch.dtype) -> list:
    """``[output]`` computed with plain PyTorch entirely in ``dtype``; ``args`` is left untouched."""
    q, k_cache, v_cache = args[Q], args[K_CACHE], args[V_CACHE]
    block_table = args[BLOCK_TABLE]
    heads, heads_k = int(args[HEADS]), int(args[HEADS_K])
    seqlen_q, causal = int(args[SEQLEN_Q]), bool(args[CAUSAL])
    page = k_cache.shape[1]
    groups = heads // heads_k
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    for b, n in enumerate(args[SEQLENS].tolist()):
        n = int(n)
        if n <= 0:
            continue
        pages = block_table[b, : math.ceil(n / page)].long()
        # (n, heads_k, D) -> (heads, n, D): each query head gets its KV head's rows.
        keys = k_cache[pages].reshape(-1, heads_k, k_cache.shape[-1])[:n].to(dtype)
        vals = v_cache[pages].reshape(-1, heads_k, v_cache.shape[-1])[:n].to(dtype)
        keys = keys.repeat_interleave(groups, dim=1).transpose(0, 1)
        vals = vals.repeat_interleave(groups, dim=1).transpose(0, 1)
        queries = q[b].to(dtype).transpose(0, 1)  # (heads, seqlen_q, D)
        scores = torch.matmul(queries, keys.transpose(1, 2)) * scale  # (heads, seqlen_q, n)
        if causal:
            # Queries sit at the end of the sequence: query i sees keys j <= n - seqlen_q + i.
            i = torch.arange(seqlen_q, device=q.device)[:, None]
            j = torch.arange(n, device=q.device)[None, :]
            scores = scores.masked_fill(j > i + (n - seqlen_q), -math.inf)
        weights = torch.softmax(scores, dim=-1)
        weights = torch.nan_to_num(weights, nan=0.0)  # a query that sees nothing outputs zeros
        out[b] = torch.matmul(weights, vals).transpose(0, 1).to(dtype)
    return [out]


def _tokens(args: list) -> list[int]:
    return [int(n) for n in args[SEQLENS].tolist()]


def bytes_moved(args: list) -> int:
    """q, the K/V rows each sequence must read, its block-table entries, cache_seqlens and output."""
    q, k_cache, out = args[Q], args[K_CACHE], args[OUTPUT]
    page = k_cache.shape[1]
    row_bytes = k_cache.shape[2] * k_cache.shape[3] * k_cache.element_size()  # one token, all KV heads
    lengths = _tokens(args)
    kv = 2 * row_bytes * sum(lengths)
    table = args[BLOCK_TABLE].element_size() * sum(math.ceil(n / page) for n in lengths)
    seqlens = args[SEQLENS].numel() * args[SEQLENS].element_size()
    return int(q.numel() * q.element_size() + kv + table + seqlens + out.numel() * out.element_size())


def flops(args: list) -> int:
    """2*D flops for each score (q.k) and 2*D for each weighted V row, over the keys each query sees."""
    heads, headdim = int(args[HEADS]), int(args[HEADDIM])
    seqlen_q, causal = int(args[SEQLEN_Q]), bool(args[CAUSAL])
    total = 0
    for n in _tokens(args):
        for i in range(seqlen_q):
            total += max(0, n - (seqlen_q - 1 - i)) if causal else n
    return 4 * headdim * heads * total


def describe(args: list) -> str:
    lengths = _tokens(args)
    if len(set(lengths)) == 1:
        seqlen = str(lengths[0])
    elif len(lengths) <= 4:
        seqlen = "[" + ",".join(map(str, lengths)) + "]"
    else:
        seqlen = f"{min(lengths)}..{max(lengths)}"
    text = f"bs={len(lengths)} seqlen={seqlen} h={int(args[HEADS])}/{int(args[HEADS_K])} d={int(args[HEADDIM])}"
    if int(args[SEQLEN_Q]) != 1:
        text += f" sq={int(args[SEQLEN_Q])}"
    if int(args[CAUSAL]):
        text += " causal"
    return text
