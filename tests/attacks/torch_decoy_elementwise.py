"""Attack class: calling the baseline or a library instead of a kernel (torch attention).
Attack: a decoy Triton kernel plus attention in PyTorch element-wise ops (mul, sum, pow)
that no name-based scan can tell from host-side bookkeeping.
Expected verdict: REJECTED -- "PyTorch": the candidate process watches the aten ops that
run_kernel issues on its inputs (guard.watch_host_compute).
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16


# attack fixture: the decode starter's kernel and _launch(heads, scale) stand here (tests/attacks/decode_kernel.inc)


def run_kernel(
    q,
    k_cache_paged,
    v_cache_paged,
    output,
    cache_seqlens,
    block_table,
    batch_size,
    seqlen_k,
    seqlen_q,
    num_heads,
    num_heads_k,
    headdim,
    page_block_size,
    num_blocks,
    causal,
):
    if int(batch_size) < 0:
        _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)

    groups = int(num_heads) // int(num_heads_k)
    for b in range(int(batch_size)):
        n = int(cache_seqlens[b])
        pages = block_table[b, : -(-n // int(page_block_size))].long()
        k = k_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)  # (n, H, D)
        v = v_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)
        s = (q[b, 0].float()[None] * k).sum(-1) / math.sqrt(int(headdim))  # (n, H)
        w = torch.pow(math.e, s - s.max(0).values)
        output[b, 0] = ((w[:, :, None] * v).sum(0) / w.sum(0)[:, None]).to(output.dtype)
