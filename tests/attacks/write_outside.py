"""Attack class: the sandbox's file system (writes outside the scratch directory).
Attack: at import, tries to leave files where a later evaluation or the user would pick them up:
the host's /tmp, next to its scratch directory (another evaluation's), optagent's own package, the
cache trusted code reads (OPTAGENT_CACHE), and through a symlink it makes into the parent directory.
Without bubblewrap the old fallback (unshare, a writable file system) let every one through.
Expected verdict: PASSED (its kernel is honest; each refused write is swallowed) with no file left
outside: bwrap's read-only view, or Landlock where bwrap is missing, refuses them all. Needs the scan
and the guard off (it imports os).
"""

import math
import os

import torch
import triton
import triton.language as tl

import optagent

BLOCK_N = 16
PLANTED = "optagent_attack_planted"
_targets = ["/tmp/" + PLANTED, "../" + PLANTED, os.path.join(os.path.dirname(optagent.__file__), PLANTED + ".py"),
            os.path.join(os.environ.get("OPTAGENT_CACHE", "/nonexistent"), PLANTED)]
for _path in _targets:
    try:
        with open(_path, "w") as _f:
            _f.write("planted")
    except OSError:
        pass
try:
    os.symlink("..", "up")
    with open(os.path.join("up", PLANTED + "_via_link"), "w") as _f:
        _f.write("planted")
except OSError:
    pass


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
