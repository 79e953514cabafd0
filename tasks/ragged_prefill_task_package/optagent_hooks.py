"""optagent hooks for the ragged-KV batch prefill task (see docs/task-format.md).

The argument list of ``run_kernel`` (and of every function here) is::

    0 q          bf16 (qo_indptr[-1], num_qo_heads, head_dim_qk)
    1 k          bf16 (kv_indptr[-1], num_kv_heads, head_dim_qk)
    2 v          bf16 (kv_indptr[-1], num_kv_heads, head_dim_vo)
    3 output     bf16 (qo_indptr[-1], num_qo_heads, head_dim_vo)     <- written
    4 qo_indptr  int32 (batch_size + 1,)
    5 kv_indptr  int32 (batch_size + 1,)
    6.. batch_size, seq_len (the longest query length), num_qo_heads,
        num_kv_heads, head_dim_qk, head_dim_vo, causal   (ints)

Sequence ``b`` owns query rows ``qo_indptr[b] .. qo_indptr[b+1]`` and key/value
rows ``kv_indptr[b] .. kv_indptr[b+1]``; with ``causal`` its queries are the last
``qo_len`` positions of the sequence, so query ``i`` sees keys
``j <= i + kv_len - qo_len`` (FlashInfer's convention).

Case parameters understood by ``make_case`` (the ``[[smoke]]``/``[[hidden]]``
tables of optagent.toml):

* ``qo_lens`` (a list, one query length per sequence) or ``seq_len`` with
  ``batch_size`` (every sequence that long); every length is at least 1;
* ``kv_lens`` (a list, each >= its query length; default: the query lengths)
  or ``prefix`` (an int or a list: cached tokens before the queries, so
  ``kv_len = prefix + qo_len``);
* ``num_qo_heads`` (4), ``num_kv_heads`` (= num_qo_heads), ``head_dim`` (128)
  or ``head_dim_qk``/``head_dim_vo``, ``causal`` (1);
* ``garbage`` (0 = off) and ``spare`` (16): ``k`` and ``v`` are exact-size
  views at the start of buffers with ``spare`` more rows, and those rows hold
  large finite values.  A kernel that reads key/value rows past
  ``kv_indptr[batch_size]`` (an unmasked tail of the last sequence) gets a
  wildly wrong answer: the garbage keys have norm ``(garbage/2 .. garbage) *
  sqrt(head_dim)`` along the normalised sum of the last sequence's query
  directions for their KV head, so they score hugely *positive*, and the
  garbage values have magnitude ``garbage/2 .. garbage``.

``output`` is created filled with NaN, so a kernel that leaves part of it
unwritten fails.
"""

from __future__ import annotations

import math

import torch

Q, K, V, OUTPUT, QO_INDPTR, KV_INDPTR = range(6)
BATCH, SEQ_LEN, QO_HEADS, KV_HEADS, DIM_QK, DIM_VO, CAUSAL = range(6, 13)


def _lengths(params: dict) -> tuple[list[int], list[int]]:
    if "qo_lens" in params:
        qo = [int(n) for n in params["qo_lens"]]
        if "batch_size" in params and int(params["batch_size"]) != len(qo):
            raise ValueError(f"qo_lens has {len(qo)} entries for batch_size {params['batch_size']}")
    else:
        qo = [int(params["seq_len"])] * int(params["batch_size"])
    if "kv_lens" in params:
        kv = [int(n) for n in params["kv_lens"]]
    else:
        prefix = params.get("prefix", 0)
        prefix = [int(p) for p in prefix] if isinstance(prefix, list) else [int(prefix)] * len(qo)
        kv = [p + n for p, n in zip(prefix, qo)]
    if len(kv) != len(qo):
        raise ValueError(f"{len(kv)} KV lengths for {len(qo)} sequences")
    if min(qo) < 1:
        raise ValueError("every sequence needs at least one query")
    if any(k < q for q, k in zip(qo, kv)):
        raise ValueError("every KV length must be at least its query length")
    return qo, kv


def _indptr(lengths: list[int], device: str) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def make_case(params: dict, device: str, seed: int) -> list:
    """The run_kernel argument list for one manifest case, deterministic in ``seed``."""
    qo_lens, kv_lens = _lengths(params)
    batch = len(qo_lens)
    heads = int(params.get("num_qo_heads", 4))
    heads_k = int(params.get("num_kv_heads", heads))
    dim_qk = int(params.get("head_dim_qk", params.get("head_dim", 128)))
    dim_vo = int(params.get("head_dim_vo", params.get("head_dim", 128)))
    causal = int(params.get("causal", 1))
    garbage = float(params.get("garbage", 0.0))
    spare = int(params.get("spare", 16)) if garbage else 0
    if heads % heads_k:
        raise ValueError(f"num_qo_heads {heads} is not a multiple of num_kv_heads {heads_k}")
    total_qo, total_kv = sum(qo_lens), sum(kv_lens)

    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    bf16 = torch.bfloat16
    q = torch.randn(total_qo, heads, dim_qk, dtype=bf16, device=device, generator=gen)
    k_buf = torch.randn(total_kv + spare, heads_k, dim_qk, dtype=bf16, device=device, generator=gen)
    v_buf = torch.randn(total_kv + spare, heads_k, dim_vo, dtype=bf16, device=device, generator=gen)
    if spare:
        # Aim the garbage keys at the last sequence's queries, KV head by KV head.
        group = heads // heads_k
        last = q[total_qo - qo_lens[-1]:].float()  # (n, heads, D)
        unit = last / last.norm(dim=-1, keepdim=True)
        direction = unit.reshape(-1, heads_k, group, dim_qk).sum(dim=(0, 2))  # (heads_k, D)
        direction = direction / direction.norm(dim=-1, keepdim=True)
        size = torch.rand(spare, heads_k, 1, device=device, generator=gen) * 0.5 + 0.5
        k_buf[total_kv:] = (garbage * math.sqrt(dim_qk) * size * direction).to(bf16)
        magnitude = torch.rand(spare, heads_k, dim_vo, device=device, generator=gen) * 0.5 + 0.5
        sign = torch.randint(0, 2, (spare, heads_k, dim_vo), device=device, generator=gen) * 2 - 1
        v_buf[total_kv:] = (garbage * magnitude * sign).to(bf16)
    k = k_buf[:total_kv]  # contiguous views: the garbage lies just past their end
    v = v_buf[:total_kv]
    output = torch.full((total_qo, heads, dim_vo), math.nan, dtype=bf16, device=device)
    return [
        q,
        k,
        v,
        output,
        _indptr(qo_lens, device),
        _indptr(kv_lens, device),
        batch,
        max(qo_lens),
        heads,
        heads_k,
        dim_qk,
        dim_vo,
        causal,
    ]


SCORE_ELEMENTS = 1 << 27  # per chunk of the reference's score matrix


def reference(args: list, dtype: torch.dtype) -> list:
    """``[output]`` computed with plain PyTorch entirely in ``dtype``; ``args`` is left untouched."""
    q, k, v = args[Q], args[K], args[V]
    heads, heads_k, causal = int(args[QO_HEADS]), int(args[KV_HEADS]), bool(args[CAUSAL])
    group = heads // heads_k
    scale = 1.0 / math.sqrt(q.shape[-1])
    qo, kv = args[QO_INDPTR].tolist(), args[KV_INDPTR].tolist()
    out = torch.zeros(q.shape[0], heads, v.shape[-1], dtype=dtype, device=q.device)
    for b in range(len(qo) - 1):
        q0, q1, k0, k1 = qo[b], qo[b + 1], kv[b], kv[b + 1]
        n_q, n_k = q1 - q0, k1 - k0
        if n_q <= 0:
            continue
        queries = q[q0:q1].to(dtype).transpose(0, 1)  # (heads, n_q, D)
        keys = k[k0:k1].to(dtype).repeat_interleave(group, dim=1).transpose(0, 1)  # (heads, n_k, D)
        vals = v[k0:k1].to(dtype).repeat_interleave(group, dim=1).transpose(0, 1)
        # query rows in chunks: a whole (heads, n_q, n_k) score matrix of a 16k-token
        # sequence is 64 GiB in float64; a chunk's stays near 1 GiB
        rows = max(1, SCORE_ELEMENTS // (heads * max(n_k, 1)))
        for c0 in range(0, n_q, rows):
            c1 = min(n_q, c0 + rows)
            scores = torch.matmul(queries[:, c0:c1], keys.transpose(1, 2)) * scale  # (heads, rows, n_k)
            if causal:
                i = torch.arange(c0, c1, device=q.device)[:, None]
                j = torch.arange(n_k, device=q.device)[None, :]
                scores = scores.masked_fill(j > i + (n_k - n_q), -math.inf)
            weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
            out[q0 + c0:q0 + c1] = torch.matmul(weights, vals).transpose(0, 1)
    return [out]


def _lens(args: list) -> tuple[list[int], list[int]]:
    qo, kv = args[QO_INDPTR].tolist(), args[KV_INDPTR].tolist()
    return [b - a for a, b in zip(qo, qo[1:])], [b - a for a, b in zip(kv, kv[1:])]


def _pairs(qo_len: int, kv_len: int, causal: bool) -> int:
    if not causal:
        return qo_len * kv_len
    prefix = kv_len - qo_len
    return sum(max(0, min(kv_len, prefix + i + 1)) for i in range(qo_len))


def bytes_moved(args: list) -> int:
    """q, every sequence's K/V rows, the output and both indptr arrays, each once."""
    q, k, v, out = args[Q], args[K], args[V], args[OUTPUT]
    _, kv_lens = _lens(args)
    kv_rows = sum(kv_lens)
    k_row = k.shape[1] * k.shape[2] * k.element_size()
    v_row = v.shape[1] * v.shape[2] * v.element_size()
    indptr = (args[QO_INDPTR].numel() + args[KV_INDPTR].numel()) * args[QO_INDPTR].element_size()
    return int(q.numel() * q.element_size() + kv_rows * (k_row + v_row) + out.numel() * out.element_size() + indptr)


def flops(args: list) -> int:
    """2*head_dim_qk flops per score and 2*head_dim_vo per weighted V row, over the visible pairs."""
    heads, causal = int(args[QO_HEADS]), bool(args[CAUSAL])
    dim_qk, dim_vo = int(args[DIM_QK]), int(args[DIM_VO])
    qo_lens, kv_lens = _lens(args)
    pairs = sum(_pairs(a, b, causal) for a, b in zip(qo_lens, kv_lens))
    return 2 * (dim_qk + dim_vo) * heads * pairs


def _list(lengths: list[int]) -> str:
    if len(set(lengths)) == 1:
        return str(lengths[0])
    if len(lengths) <= 4:
        return "[" + ",".join(map(str, lengths)) + "]"
    return f"{min(lengths)}..{max(lengths)}"


def describe(args: list) -> str:
    qo_lens, kv_lens = _lens(args)
    text = f"bs={len(qo_lens)} qo={_list(qo_lens)}"
    if kv_lens != qo_lens:
        text += f" kv={_list(kv_lens)}"
    text += f" h={int(args[QO_HEADS])}/{int(args[KV_HEADS])} d={int(args[DIM_QK])}"
    if int(args[DIM_VO]) != int(args[DIM_QK]):
        text += f"/{int(args[DIM_VO])}"
    return text + (" causal" if int(args[CAUSAL]) else "")
