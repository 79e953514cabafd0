"""Attack class: the parent as a confused deputy (FIFOs planted in the scratch directory).
Attack: at import, replaces the names the orchestrator used to open with a plain open() after the
candidate process exits (job-judge.json, judge.log) and the log it is writing (candidate.log) with
FIFOs: an open() for writing blocks until a reader comes, and none ever does. The old orchestrator
hung there with no verdict and no timeout armed.
Expected verdict: PASSED (its kernel is honest) in the usual time: the parent hands the judge its job
by descriptor and creates its logs through the directory's descriptor, O_EXCL|O_NOFOLLOW|O_NONBLOCK,
so a FIFO there blocks nothing. Needs the scan and the guard off (it imports os).
"""

import math
import os

import torch
import triton
import triton.language as tl

BLOCK_N = 16

for _name in ("job-judge.json", "judge.log", "candidate.log"):
    try:
        os.unlink(_name)
    except OSError:
        pass
    os.mkfifo(_name)


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
