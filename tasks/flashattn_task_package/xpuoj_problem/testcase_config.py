"""Test cases of the paged KV-cache decode task (FlashAttention ``flash_attn_with_kvcache``).

Contest entry points: ``getNumOfTestcases``, ``getTestCaseSize`` (reads the
1-based case number from stdin), ``genTestCase``, ``baseline`` and ``check``.
The case list, the KV pool size and the random streams are those of the
contest's own package, so case ``i`` here produces the same tensors there.

Only ``getNumOfTestcases`` works without torch; everything else imports it
when called.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

# ----------------------------------------------------------------------------
# The case list: one head dim, every KV length crossed with every batch size.
# ----------------------------------------------------------------------------
PAGE_BLOCK_SIZE = 16
SEQLEN_Q = 1
NUM_HEADS = 8
NUM_HEADS_K = 8
CAUSAL = 0
SEED_BASE = 20260720  # case i (0-based) draws from torch.Generator seeded SEED_BASE + i
WARMUP = 3
BASE_REPS = 100

CASES = [
    # (batch_size, seqlen_k, seqlen_q, num_heads, num_heads_k, headdim, page_block_size, causal)
    (batch, seqlen_k, SEQLEN_Q, NUM_HEADS, NUM_HEADS_K, headdim, PAGE_BLOCK_SIZE, CAUSAL)
    for headdim in (128,)
    for seqlen_k in (1024, 4096, 8192, 16384)
    for batch in (1, 4, 16)
]

# Filled by getTestCaseSize, read by genTestCase (the contest calls them in that order).
CURRENT_CASE: dict | None = None


def getNumOfTestcases() -> int:
    return len(CASES)


def _read_case_index() -> int:
    """0-based case index from the first token on stdin.

    1..N are the contest's 1-based numbers; 0 is taken as already 0-based;
    anything else (nothing, not a number, out of range) falls back to the first case.
    """
    try:
        line = input()
    except EOFError:
        return 0
    words = line.split()
    if not words:
        return 0
    try:
        number = int(words[0])
    except ValueError:
        return 0
    if 1 <= number <= len(CASES):
        return number - 1
    return 0


def kv_pool_blocks(batch_size: int, seqlen_k: int, page_block_size: int) -> int:
    """Pages in the shared KV pool: three times what the batch needs, at least 1024."""
    return max(1024, 3 * batch_size * math.ceil(seqlen_k / page_block_size))


def timing_iters(batch_size: int, seqlen_k: int, headdim: int) -> int:
    """Timed repetitions: fewer for bigger problems (100 halving per decade of work)."""
    work = batch_size * seqlen_k * headdim
    reps = BASE_REPS
    for bound in (1e5, 1e6, 1e7, 1e8, 1e9):
        if work < bound:
            break
        reps //= 2
    return max(1, reps)


def getTestCaseSize():
    """``(shapes of the run_kernel arguments, (warmup, iters))`` for the case named on stdin."""
    global CURRENT_CASE
    index = _read_case_index()
    batch, seqlen_k, seqlen_q, heads, heads_k, headdim, page, causal = CASES[index]
    num_blocks = kv_pool_blocks(batch, seqlen_k, page)
    CURRENT_CASE = dict(
        batch_size=batch,
        seqlen_k=seqlen_k,
        seqlen_q=seqlen_q,
        num_heads=heads,
        num_heads_k=heads_k,
        headdim=headdim,
        page_block_size=page,
        num_blocks=num_blocks,
        causal=causal,
        seed=SEED_BASE + index,
    )
    q_shape = (batch, seqlen_q, heads, headdim)
    cache_shape = (num_blocks, page, heads_k, headdim)
    shapes = [
        q_shape,  # q
        cache_shape,  # k_cache_paged
        cache_shape,  # v_cache_paged
        q_shape,  # output
        (batch,),  # cache_seqlens
        (batch, num_blocks // batch),  # block_table
    ] + [()] * 9  # the nine integer arguments
    return shapes, (WARMUP, timing_iters(batch, seqlen_k, headdim))


def genTestCase(testcase_sizes, device: str = "cuda"):
    """The run_kernel arguments of the case chosen by the last getTestCaseSize call."""
    import torch

    del testcase_sizes  # everything needed is in CURRENT_CASE
    if CURRENT_CASE is None:
        raise RuntimeError("genTestCase called before getTestCaseSize")
    c = CURRENT_CASE
    gen = torch.Generator(device=device)
    gen.manual_seed(c["seed"])
    bf16 = torch.bfloat16
    q_shape = (c["batch_size"], c["seqlen_q"], c["num_heads"], c["headdim"])
    cache_shape = (c["num_blocks"], c["page_block_size"], c["num_heads_k"], c["headdim"])
    # Draw order matters for reproducibility: q, K pool, V pool, then the page permutation.
    q = torch.randn(q_shape, dtype=bf16, device=device, generator=gen)
    k_cache = torch.randn(cache_shape, dtype=bf16, device=device, generator=gen)
    v_cache = torch.randn(cache_shape, dtype=bf16, device=device, generator=gen)
    output = torch.empty(q_shape, dtype=bf16, device=device)
    cache_seqlens = torch.full((c["batch_size"],), c["seqlen_k"], dtype=torch.int32, device=device)
    block_table = torch.randperm(c["num_blocks"], dtype=torch.int32, device=device, generator=gen)
    block_table = block_table.view(c["batch_size"], c["num_blocks"] // c["batch_size"])
    return [
        q,
        k_cache,
        v_cache,
        output,
        cache_seqlens,
        block_table,
        c["batch_size"],
        c["seqlen_k"],
        c["seqlen_q"],
        c["num_heads"],
        c["num_heads_k"],
        c["headdim"],
        c["page_block_size"],
        c["num_blocks"],
        c["causal"],
    ]


def _import_flash_attn_with_kvcache():
    """FlashAttention's ``flash_attn_with_kvcache``.

    Tried in order: an installed ``flash_attn``; a ``flashattn/flash_attn`` source
    checkout in a folder above this file (as the contest lays it out); optagent's
    PyTorch stand-in under ``agent/worker/compat`` above this file (its package sets
    ``flash_attn.STANDIN = True`` so that results can be labelled).
    """
    try:
        from flash_attn.flash_attn_interface import flash_attn_with_kvcache

        return flash_attn_with_kvcache
    except ImportError:
        pass
    here = Path(__file__).resolve()
    roots = [p / "flashattn" for p in here.parents] + [p / "agent" / "worker" / "compat" for p in here.parents]
    for root in roots:
        if (root / "flash_attn").is_dir():
            sys.path.insert(0, str(root))
            sys.modules.pop("flash_attn", None)
            try:
                from flash_attn.flash_attn_interface import flash_attn_with_kvcache

                return flash_attn_with_kvcache
            except ImportError:
                sys.path.remove(str(root))
                sys.modules.pop("flash_attn", None)
    raise ImportError("flash_attn is not installed and no flash_attn checkout or stand-in was found")


def baseline(
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
    """Fill ``output`` with FlashAttention's answer and return the argument list."""
    flash_attn_with_kvcache = _import_flash_attn_with_kvcache()
    result = flash_attn_with_kvcache(
        q,
        k_cache_paged,
        v_cache_paged,
        None,
        None,
        cache_seqlens=cache_seqlens,
        cache_batch_idx=None,
        block_table=block_table,
        causal=bool(causal),
        window_size=(-1, -1),
        rotary_interleaved=False,
        alibi_slopes=None,
        num_splits=1,
    )
    output.copy_(result)
    return [
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
    ]


def check(
    testcase_sizes,
    original_input_tensors,
    target_kernel_input_tensors,
    baseline_input_tensors,
    rtol=1e-2,
    atol=1e-2,
) -> bool:
    """True when the candidate's ``output`` (argument 3) is allclose to the baseline's."""
    import torch

    del testcase_sizes, original_input_tensors
    got = target_kernel_input_tensors[3]
    want = baseline_input_tensors[3]
    if got.shape != want.shape:
        print(f"[FAIL] output shape {tuple(got.shape)} != expected {tuple(want.shape)}", file=sys.stderr)
        return False
    if got.dtype != want.dtype:
        print(f"[FAIL] output dtype {got.dtype} != expected {want.dtype}", file=sys.stderr)
        return False
    got32, want32 = got.float(), want.float()
    if torch.allclose(got32, want32, rtol=rtol, atol=atol):
        return True
    err = (got32 - want32).abs()
    err = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    print(
        f"[FAIL] output not close to baseline (rtol={rtol}, atol={atol}): "
        f"max |diff| {err.max().item():.6f}, mean |diff| {err.mean().item():.6f}",
        file=sys.stderr,
    )
    return False
