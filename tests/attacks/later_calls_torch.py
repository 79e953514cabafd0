"""Attack class: calling the baseline or a library instead of a kernel (PyTorch from the second call on).
Attack: its first call runs its Triton kernel (the one call per case the dispatch watch used to see);
every later call computes the attention with PyTorch.
Expected verdict: REJECTED -- "PyTorch": on the CPU every checked call runs under the watch (the
fresh inputs' calls too). Run with the scan off (its element-wise ops pass it as torch_decoy's do).
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16
_calls = [0]


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
    _calls[0] += 1
    if _calls[0] == 1:
        _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
        return
    groups = int(num_heads) // int(num_heads_k)
    for b in range(int(batch_size)):
        n = int(cache_seqlens[b])
        pages = block_table[b, : -(-n // int(page_block_size))].long()
        k = k_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)  # (n, H, D)
        v = v_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)
        s = (q[b, 0].float()[None] * k).sum(-1) / math.sqrt(int(headdim))  # (n, H)
        w = torch.pow(math.e, s - s.max(0).values)
        output[b, 0] = ((w[:, :, None] * v).sum(0) / w.sum(0)[:, None]).to(output.dtype)
