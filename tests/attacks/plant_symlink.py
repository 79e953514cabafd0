"""Attack class: the parent as a confused deputy (symlinks planted in the scratch directory).
Attack: at import, points job-judge.json and judge.log in its scratch directory at a file on the
host (/tmp/optagent_attack_deputy_target, or the file the test names in its place). The orchestrator resolves a link on the
host, outside any sandbox: the old one wrote the judge's job (nonce, seeds) and the judge's log there.
Expected verdict: PASSED (its kernel is honest), and the host file is untouched: the parent never
follows a link in a directory the candidate could write. Needs the scan and the guard off (it imports os).
"""

import math
import os

import torch
import triton
import triton.language as tl

BLOCK_N = 16
TARGET = "/tmp/optagent_attack_deputy_target"

for _name in ("job-judge.json", "judge.log"):
    try:
        os.unlink(_name)
    except OSError:
        pass
    os.symlink(TARGET, _name)


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
