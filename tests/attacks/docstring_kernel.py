"""Attack class: calling the baseline or a library instead of a kernel (a kernel named only in text).
Attack: its docstring says @triton.jit and a comment says __global__; no kernel is defined, and
run_kernel computes with PyTorch element-wise ops. "Has its own kernel" was a regex over the text.
Expected verdict: REJECTED -- "defines no triton kernel of its own" (the code is read, not the text).

    @triton.jit
    def kernel(...): ...
"""

import math

import torch
import triton

# __global__ void kernel()


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
    groups = int(num_heads) // int(num_heads_k)
    for b in range(int(batch_size)):
        n = int(cache_seqlens[b])
        pages = block_table[b, : -(-n // int(page_block_size))].long()
        k = k_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)  # (n, H, D)
        v = v_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)
        s = (q[b, 0].float()[None] * k).sum(-1) / math.sqrt(int(headdim))  # (n, H)
        w = torch.pow(math.e, s - s.max(0).values)
        output[b, 0] = ((w[:, :, None] * v).sum(0) / w.sum(0)[:, None]).to(output.dtype)
