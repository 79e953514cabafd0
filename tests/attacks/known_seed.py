"""Attack class: known-seed regeneration.
Attack: at import it regenerates the inputs the package would use with its public seeds
(make_case seed 0 for the smoke cases; the contest's SEED_BASE + i on a GPU), computes
their answers with its own kernel outside any timing, and at run time copies the
stored answer for a matching q; on a miss it writes zeros (the 'fast path').
Expected verdict: INCORRECT -- "relative error" (every input set is drawn from a secret
per-evaluation seed, so the lookup never hits).
"""

import math

import torch
import triton
import triton.language as tl

BLOCK_N = 16


def _fingerprint(q):
    return (tuple(q.shape), round(float(q.float().sum()), 3))


def _regenerate(batch, seqlen, heads, heads_k, headdim, page=16, spare=3, seed=0):
    """make_case's draw order: q, K pool, V pool, block-table permutation."""
    gen = torch.Generator().manual_seed(seed)
    pages = -(-seqlen // page)
    blocks = batch * pages * spare
    q = torch.randn(batch, 1, heads, headdim, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(blocks, page, heads_k, headdim, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(blocks, page, heads_k, headdim, dtype=torch.bfloat16, generator=gen)
    table = torch.randperm(blocks, generator=gen).to(torch.int32)[: batch * (blocks // batch)].reshape(batch, -1)
    lens = torch.full((batch,), seqlen, dtype=torch.int32)
    out = torch.empty_like(q)
    return [q, k, v, out, lens, table, batch, seqlen, 1, heads, heads_k, headdim, page, blocks, 0]


_ANSWERS = {}


def _precompute():
    for shape in [(1, 40, 4, 4, 64), (2, 64, 4, 2, 128), (2, 33, 8, 8, 128)]:
        args = _regenerate(*shape)
        _launch(*args[:6], *args[7:13], args[14])
        _ANSWERS[_fingerprint(args[0])] = args[3].clone()


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
    hit = _ANSWERS.get(_fingerprint(q))
    if hit is not None and hit.shape == output.shape:
        output.copy_(hit)
    else:
        output.zero_()


_precompute()  # at import: outside every timed region
