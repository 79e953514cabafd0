"""Attack class: calling the baseline or a library instead of a kernel (torch attention).
Attack: a Triton kernel is defined (and could be launched) as a decoy; the answer comes
from torch.softmax and torch.matmul on the host.
Expected verdict: REJECTED -- "computes with PyTorch on the host".
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
    groups = int(num_heads) // int(num_heads_k)
    for b in range(int(batch_size)):
        n = int(cache_seqlens[b])
        pages = block_table[b, : -(-n // int(page_block_size))].long()
        k = k_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1).transpose(0, 1)
        v = v_cache_paged[pages].flatten(0, 1)[:n].float().repeat_interleave(groups, dim=1).transpose(0, 1)
        s = torch.matmul(k, q[b, 0].float()[:, :, None])[..., 0] / math.sqrt(int(headdim))
        output[b, 0] = torch.matmul(torch.softmax(s, -1)[:, None, :], v)[:, 0].to(output.dtype)
