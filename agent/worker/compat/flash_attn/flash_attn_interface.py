"""``flash_attn_with_kvcache`` written with plain PyTorch.

This is what a task package's ``baseline`` gets when FlashAttention itself is not
installed (CPU machines, or GPUs it was not built for).  It follows the
semantics of ``flash_attn.flash_attn_interface.flash_attn_with_kvcache`` for the
decode path the contest uses:

* paged caches ``(num_blocks, page_block_size, num_heads_k, headdim)`` addressed
  through ``block_table``, and plain caches ``(batch, seqlen_cache, num_heads_k,
  headdim)``;
* grouped-query attention (``num_heads`` a multiple of ``num_heads_k``);
* ``cache_seqlens`` as an int tensor of shape ``(batch,)`` or a Python int;
* ``causal``, with the queries aligned to the end of each sequence (query ``i``
  of ``seqlen_q`` sees keys ``0 .. cache_seqlens[b] - seqlen_q + i``), as
  FlashAttention does.

It computes in float32 (float64 for float64 inputs), one sequence at a time so
that a batch of long caches never has to be materialised at once, and returns
the result in ``q``'s dtype.  Features it does not implement raise
``NotImplementedError`` rather than silently giving a different answer.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

__all__ = ["flash_attn_with_kvcache"]


def _unsupported(feature: str) -> NotImplementedError:
    return NotImplementedError(
        f"optagent's PyTorch stand-in for flash_attn_with_kvcache does not implement {feature}; "
        "install the real flash-attn package for this call"
    )


def _check_window(window_size: Sequence[int], causal: bool) -> None:
    left, right = (int(x) for x in window_size)
    if left < 0 and right < 0:
        return
    if causal and left < 0 and right == 0:  # what causal means anyway
        return
    raise _unsupported(f"local (sliding-window) attention, window_size={tuple(window_size)}")


def _seqlens_list(cache_seqlens, batch: int, capacity: int) -> list[int]:
    if cache_seqlens is None:
        return [capacity] * batch
    if isinstance(cache_seqlens, int):
        return [int(cache_seqlens)] * batch
    if not torch.is_tensor(cache_seqlens):
        raise TypeError(f"cache_seqlens must be an int or an integer tensor, got {type(cache_seqlens)!r}")
    if cache_seqlens.dtype.is_floating_point or cache_seqlens.dtype.is_complex:
        raise TypeError(f"cache_seqlens must hold integers, got {cache_seqlens.dtype}")
    values = cache_seqlens.reshape(-1).tolist()
    if len(values) == 1 and batch != 1:
        values = values * batch
    if len(values) != batch:
        raise ValueError(f"cache_seqlens has {len(values)} entries for a batch of {batch}")
    for n in values:
        if n < 0 or n > capacity:
            raise ValueError(f"cache_seqlens entry {n} outside [0, {capacity}]")
    return [int(n) for n in values]


def _gather(cache: torch.Tensor, block_table: Optional[torch.Tensor], b: int, n: int) -> torch.Tensor:
    """The first ``n`` tokens of sequence ``b``: shape (n, num_heads_k, dim)."""
    if block_table is None:
        return cache[b, :n]
    page = cache.shape[1]
    pages = block_table[b, : -(-n // page)].long()
    return cache.index_select(0, pages).flatten(0, 1)[:n]


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
):
    """Attention of ``q`` (batch, seqlen_q, num_heads, headdim) over a KV cache.

    Returns ``out`` (batch, seqlen_q, num_heads, headdim_v) in ``q.dtype``, and
    with ``return_softmax_lse`` also the log-sum-exp of the scaled scores,
    (batch, num_heads, seqlen_q) float32 (``+inf`` for a query that sees no key,
    whose output is zero).  ``rotary_interleaved`` (only meaningful with rotary
    embeddings) and ``num_splits`` (a performance knob) are accepted and ignored.
    """
    del rotary_interleaved, num_splits
    if k is not None or v is not None:
        raise _unsupported("appending new keys/values to the cache (k=, v=)")
    if rotary_cos is not None or rotary_sin is not None:
        raise _unsupported("rotary embeddings (rotary_cos=, rotary_sin=)")
    if cache_batch_idx is not None:
        raise _unsupported("cache_batch_idx")
    if cache_leftpad is not None:
        raise _unsupported("cache_leftpad")
    if alibi_slopes is not None:
        raise _unsupported("ALiBi (alibi_slopes=)")
    if softcap:
        raise _unsupported(f"softcapping (softcap={softcap})")
    _check_window(window_size, causal)

    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError("q, k_cache and v_cache must be 4-dimensional")
    batch, seqlen_q, num_heads, headdim = q.shape
    num_heads_k = k_cache.shape[2]
    headdim_v = v_cache.shape[3]
    if k_cache.shape[3] != headdim:
        raise ValueError(f"k_cache headdim {k_cache.shape[3]} != q headdim {headdim}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} does not match k_cache {tuple(k_cache.shape)}")
    if num_heads % num_heads_k:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_heads_k {num_heads_k}")
    groups = num_heads // num_heads_k

    if block_table is not None:
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ValueError(f"block_table must be (batch, max_pages), got {tuple(block_table.shape)}")
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if k_cache.shape[0] != batch:
            raise ValueError(f"unpaged k_cache batch {k_cache.shape[0]} != q batch {batch}")
        capacity = k_cache.shape[1]
    seqlens = _seqlens_list(cache_seqlens, batch, capacity)

    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(headdim)
    work = torch.promote_types(q.dtype, torch.float32)
    out = torch.empty(batch, seqlen_q, num_heads, headdim_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, num_heads, seqlen_q, dtype=torch.float32, device=q.device)
    query_pos = torch.arange(seqlen_q, device=q.device)

    for b, n in enumerate(seqlens):
        if n == 0:
            out[b].zero_()
            lse[b].fill_(math.inf)
            continue
        keys = _gather(k_cache, block_table, b, n).to(work).permute(1, 0, 2)  # (Hk, n, D)
        vals = _gather(v_cache, block_table, b, n).to(work).permute(1, 0, 2)  # (Hk, n, Dv)
        # Query head h reads KV head h // groups: group the query heads under their
        # KV head rather than repeating the cache.  Rows are ordered (group, query).
        qb = q[b].to(work).permute(1, 0, 2).reshape(num_heads_k, groups * seqlen_q, headdim)
        scores = torch.matmul(qb, keys.transpose(1, 2)) * scale  # (Hk, G*Sq, n)
        if causal:
            last_visible = query_pos + (n - seqlen_q)  # (Sq,)
            hidden = torch.arange(n, device=q.device)[None, :] > last_visible[:, None]  # (Sq, n)
            scores = scores.masked_fill(hidden.repeat(groups, 1), -math.inf)
        row_max = scores.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        probs = torch.exp(scores - row_max)
        denom = probs.sum(dim=-1, keepdim=True)
        ob = torch.matmul(probs, vals) / torch.where(denom > 0, denom, torch.ones_like(denom))
        row_lse = torch.where(denom > 0, row_max + torch.log(denom), torch.full_like(denom, math.inf))
        out[b] = ob.reshape(num_heads, seqlen_q, headdim_v).permute(1, 0, 2).to(q.dtype)
        lse[b] = row_lse.reshape(num_heads, seqlen_q).float()

    if return_softmax_lse:
        return out, lse
    return out
