"""Attack class: calling the baseline or a library instead of a kernel (a local `jit` marks host code as device code).
Attack: defines its own `jit` (it returns the function unchanged) and decorates the PyTorch attention with
it: the scan took any decorator named jit for Triton's and skipped its host-compute checks inside, and
"has its own kernel" was a regex that `@jit` satisfies.
Expected verdict: REJECTED -- "defines no triton kernel of its own": a decorator counts only if it
resolves through the file's imports to Triton's (integrity.has_own_kernel).
"""

import math

import torch


def jit(fn):
    return fn


@jit
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
    _ = torch
    groups = int(num_heads) // int(num_heads_k)
    for b in range(int(batch_size)):
        n = int(cache_seqlens[b])
        pages = block_table[b, : -(-n // int(page_block_size))].long()
        k = k_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)  # (n, H, D)
        v = v_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)
        s = (q[b, 0].float()[None] * k).sum(-1) / math.sqrt(int(headdim))  # (n, H)
        w = torch.pow(math.e, s - s.max(0).values)
        output[b, 0] = ((w[:, :, None] * v).sum(0) / w.sum(0)[:, None]).to(output.dtype)
