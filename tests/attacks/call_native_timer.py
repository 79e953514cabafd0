"""Attack class: timer tricks (the candidate calls the native timer itself).
Attack: finds the loaded native timer (optagent.worker.timers.NATIVE, through torch.sys.modules)
and times a no-op in the first smoke case's name, hoping its record is the one that counts.
Expected verdict: REJECTED -- "torch.sys" (statically).  With the scan bypassed: REJECTED "an
extra eager timing record" (a case gets one eager loop, a second only after a slow host).
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16

_timers = torch.sys.modules.get("optagent.worker.timers")
if _timers is not None and _timers.NATIVE is not None and not hasattr(_timers, "forged"):
    _timers.forged = True
    _timers.NATIVE.session("smoke-1", 1, 4).eager("eager", lambda *a: None, [[0]], None)


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
    _launch(q, k_cache_paged, v_cache_paged, output, cache_seqlens, block_table, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
