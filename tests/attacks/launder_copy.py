"""Attack class: calling the baseline or a library instead of a kernel (inputs laundered through a Triton copy).
Attack: copies K and V with a Triton kernel into fresh buffers (torch.empty: nothing of the inputs'
reaches them through an aten op), then computes the attention with PyTorch on the copies; a watch that
taints only what aten ops derive from the inputs saw nothing to object to.
Expected verdict: REJECTED -- "PyTorch": a fresh floating buffer the size of an input is watched as the
inputs are (guard.watch_host_compute). Run with the scan off (its element-wise ops pass it as torch_decoy's do).
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)


def _launder(t):
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    _copy[(triton.cdiv(t.numel(), 1024),)](t, out, t.numel(), BLOCK=1024)
    return out


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
    k_cache_paged, v_cache_paged = _launder(k_cache_paged), _launder(v_cache_paged)
    groups = int(num_heads) // int(num_heads_k)
    for b in range(int(batch_size)):
        n = int(cache_seqlens[b])
        pages = block_table[b, : -(-n // int(page_block_size))].long()
        k = k_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)  # (n, H, D)
        v = v_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1)
        s = (q[b, 0].float()[None] * k).sum(-1) / math.sqrt(int(headdim))  # (n, H)
        w = torch.pow(math.e, s - s.max(0).values)
        output[b, 0] = ((w[:, :, None] * v).sum(0) / w.sum(0)[:, None]).to(output.dtype)
