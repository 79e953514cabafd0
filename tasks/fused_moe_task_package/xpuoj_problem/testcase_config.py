"""Test cases of the fused mixture-of-experts task (vLLM ``fused_experts``).

Contest entry points: ``getNumOfTestcases``, ``getTestCaseSize`` (reads the
1-based case number from stdin), ``genTestCase``, ``baseline`` and ``check``.

The baseline is vLLM's ``fused_experts`` when ``vllm`` can be imported and the
tensors are on a GPU; otherwise it is the PyTorch implementation in this file
(``_torch_fused_moe``).  ``BASELINE_LABEL`` says which one is in use.

Only ``getNumOfTestcases`` and ``getTestCaseSize`` work without torch;
everything else imports it when called.
"""

from __future__ import annotations

import sys

# ----------------------------------------------------------------------------
# The case list: the routed experts of four open MoE models, at decode-sized
# and prefill-sized token counts.
# ----------------------------------------------------------------------------
SEED_BASE = 20260815  # case i (0-based) draws from torch.Generator seeded SEED_BASE + i
WARMUP = 3
BASE_REPS = 100

MODELS = {
    # name: (hidden_size, intermediate_size, num_experts, top_k, renormalize top-k weights)
    "Mixtral-8x7B": (4096, 14336, 8, 2, True),
    "OLMoE-1B-7B": (2048, 1024, 64, 8, False),
    "Qwen1.5-MoE-A2.7B": (2048, 1408, 60, 4, False),
    "DeepSeek-V2-Lite": (2048, 1408, 64, 6, False),  # routed experts only
}


def _case(model: str, num_tokens: int) -> dict:
    hidden, inter, experts, top_k, renorm = MODELS[model]
    return dict(model=model, num_tokens=num_tokens, hidden_size=hidden, intermediate_size=inter,
                num_experts=experts, top_k=top_k, renormalize=renorm)


CASES = [
    _case("Mixtral-8x7B", 1),
    _case("Mixtral-8x7B", 32),
    _case("Mixtral-8x7B", 512),
    _case("Mixtral-8x7B", 4096),
    _case("OLMoE-1B-7B", 1),
    _case("OLMoE-1B-7B", 64),
    _case("OLMoE-1B-7B", 2048),
    _case("Qwen1.5-MoE-A2.7B", 16),
    _case("Qwen1.5-MoE-A2.7B", 1024),
    _case("DeepSeek-V2-Lite", 256),
    _case("DeepSeek-V2-Lite", 8192),
]

# Filled by getTestCaseSize, read by genTestCase (the contest calls them in that order).
CURRENT_CASE: dict | None = None


def getNumOfTestcases() -> int:
    return len(CASES)


def _read_case_index() -> int:
    """0-based case index from the first token on stdin (1..N; anything else: the first case)."""
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


def timing_iters(case: dict) -> int:
    """Timed repetitions: 100 for tiny problems, halving per decade of multiply-adds, at least 3."""
    work = 3 * case["num_tokens"] * case["top_k"] * case["hidden_size"] * case["intermediate_size"]
    reps = BASE_REPS
    for bound in (1e9, 1e10, 1e11, 1e12, 1e13):
        if work < bound:
            break
        reps //= 2
    return max(3, reps)


def getTestCaseSize():
    """``(shapes of the run_kernel arguments, (warmup, iters))`` for the case named on stdin."""
    global CURRENT_CASE
    index = _read_case_index()
    c = CASES[index]
    CURRENT_CASE = dict(c, seed=SEED_BASE + index)
    t, h, i, e, k = c["num_tokens"], c["hidden_size"], c["intermediate_size"], c["num_experts"], c["top_k"]
    shapes = [
        (t, h),  # hidden_states
        (e, 2 * i, h),  # w13: gate rows then up rows
        (e, h, i),  # w2
        (t, k),  # topk_weights
        (t, k),  # topk_ids
        (t, h),  # output
    ] + [()] * 5  # the five integer arguments
    return shapes, (WARMUP, timing_iters(c))


def route(logits, top_k: int, renormalize: bool):
    """Softmax router: the top_k experts of each token and their (renormalised) probabilities."""
    import torch

    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.contiguous(), ids.to(torch.int32).contiguous()


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
    t, h, i, e, k = c["num_tokens"], c["hidden_size"], c["intermediate_size"], c["num_experts"], c["top_k"]
    # Draw order matters for reproducibility: x, w13, w2, router logits.  Weights are
    # scaled by 1/sqrt(fan-in) so that every activation stays of order one.
    x = torch.randn((t, h), dtype=bf16, device=device, generator=gen)
    w13 = torch.randn((e, 2 * i, h), dtype=bf16, device=device, generator=gen).mul_(h**-0.5)
    w2 = torch.randn((e, h, i), dtype=bf16, device=device, generator=gen).mul_(i**-0.5)
    logits = torch.randn((t, e), dtype=torch.float32, device=device, generator=gen)
    topk_weights, topk_ids = route(logits, k, c["renormalize"])
    output = torch.empty((t, h), dtype=bf16, device=device)
    return [x, w13, w2, topk_weights, topk_ids, output, t, h, i, e, k]


# ----------------------------------------------------------------------------
# The baseline: vLLM when available, else PyTorch.
# ----------------------------------------------------------------------------
def _find_vllm_fused_experts():
    try:
        from vllm.model_executor.layers.fused_moe import fused_experts

        return fused_experts
    except Exception:  # not installed, or installed without a usable CUDA build
        return None


_VLLM_FUSED_EXPERTS = _find_vllm_fused_experts()
BASELINE_LABEL = (
    "vllm.model_executor.layers.fused_moe.fused_experts"
    if _VLLM_FUSED_EXPERTS is not None
    else "PyTorch fused MoE (one bf16 matmul pair per expert; vllm not installed)"
)


def _torch_fused_moe(x, w13, w2, topk_weights, topk_ids, output):
    """Expert by expert: gather its tokens, gate/up matmul, SiLU-and-mul, down matmul, weighted sum.

    Matmuls run in the inputs' dtype (bf16, float32 accumulation inside); the
    weighted sum over each token's experts is accumulated in float32.
    """
    import torch
    import torch.nn.functional as F

    inter = w2.shape[-1]
    acc = torch.zeros(output.shape, dtype=torch.float32, device=output.device)
    flat_ids = topk_ids.reshape(-1).long()
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start:start + count]
        start += count
        tokens = pairs // topk_ids.shape[1]
        h = x[tokens] @ w13[expert].t()  # (count, 2 * inter)
        act = F.silu(h[:, :inter]) * h[:, inter:]
        y = act @ w2[expert].t()  # (count, hidden)
        acc.index_add_(0, tokens, y.float() * topk_weights.reshape(-1)[pairs].float()[:, None])
    output.copy_(acc)


def baseline(hidden_states, w13, w2, topk_weights, topk_ids, output, num_tokens, hidden_size, intermediate_size,
             num_experts, top_k):
    """Fill ``output`` with the baseline's answer and return the argument list."""
    if _VLLM_FUSED_EXPERTS is not None and hidden_states.is_cuda:
        output.copy_(_VLLM_FUSED_EXPERTS(hidden_states, w13, w2, topk_weights, topk_ids))
    else:
        _torch_fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, output)
    return [hidden_states, w13, w2, topk_weights, topk_ids, output, num_tokens, hidden_size, intermediate_size,
            num_experts, top_k]


def check(
    testcase_sizes,
    original_input_tensors,
    target_kernel_input_tensors,
    baseline_input_tensors,
    rtol=1e-2,
    atol=2e-2,
    max_rel_l2=2e-2,
) -> bool:
    """True when the candidate's ``output`` (argument 5) matches the baseline's.

    Two conditions: element-wise ``allclose(rtol, atol)`` and a relative L2 error
    ``||out - ref|| / ||ref||`` of at most ``max_rel_l2``.

    atol is 2e-2, not 1e-2: the PyTorch baseline rounds the gate/up and down
    products to bf16, so its own error against a float64 reference is about 4e-3
    (relative L2).  A kernel that keeps them in float32 is twice as accurate, yet over
    the 16.7M outputs of the 4096-token Mixtral case the largest difference from
    the baseline reaches 0.0156 (measured), past 1e-2 + 1e-2 * |baseline|.
    """
    import torch

    del testcase_sizes, original_input_tensors
    got = target_kernel_input_tensors[5]
    want = baseline_input_tensors[5]
    if got.shape != want.shape:
        print(f"[FAIL] output shape {tuple(got.shape)} != expected {tuple(want.shape)}", file=sys.stderr)
        return False
    if got.dtype != want.dtype:
        print(f"[FAIL] output dtype {got.dtype} != expected {want.dtype}", file=sys.stderr)
        return False
    got32, want32 = got.float(), want.float()
    if not torch.isfinite(got32).all():
        print("[FAIL] output has NaN or Inf (unwritten or overflowed elements)", file=sys.stderr)
        return False
    close = torch.allclose(got32, want32, rtol=rtol, atol=atol)
    rel_l2 = ((got32 - want32).norm() / want32.norm().clamp_min(1e-30)).item()
    if close and rel_l2 <= max_rel_l2:
        return True
    err = (got32 - want32).abs()
    print(
        f"[FAIL] output not close to baseline (rtol={rtol}, atol={atol}, max rel L2={max_rel_l2}): "
        f"max |diff| {err.max().item():.6f}, mean |diff| {err.mean().item():.6f}, rel L2 {rel_l2:.4f}",
        file=sys.stderr,
    )
    return False
