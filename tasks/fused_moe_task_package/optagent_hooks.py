"""optagent hooks for the fused mixture-of-experts task (see docs/task-format.md).

The argument list of ``run_kernel`` (and of every function here) is::

    0 hidden_states  bf16 (num_tokens, hidden_size)
    1 w13            bf16 (num_experts, 2 * intermediate_size, hidden_size)  gate rows, then up rows
    2 w2             bf16 (num_experts, hidden_size, intermediate_size)
    3 topk_weights   float32 (num_tokens, top_k)
    4 topk_ids       int32 (num_tokens, top_k)   distinct experts per token
    5 output         bf16 (num_tokens, hidden_size)                         <- written
    6.. num_tokens, hidden_size, intermediate_size, num_experts, top_k   (ints)

    output[t] = sum_j topk_weights[t, j] * w2[e] @ (silu(w13[e, :I] @ x[t]) * (w13[e, I:] @ x[t])),
    e = topk_ids[t, j], I = intermediate_size.

Case parameters understood by ``make_case`` (the ``[[smoke]]``/``[[hidden]]``
tables of optagent.toml):

* ``num_tokens``, ``hidden_size``, ``intermediate_size``, ``num_experts``,
  ``top_k``; ``renormalize`` (1: the top-k probabilities are rescaled to sum
  to one, as Mixtral does; 0: kept as the softmax gave them);
* ``routing``: ``"softmax"`` (default: random router logits, softmax, top-k),
  ``"one_expert"`` (every token's first choice is expert ``hot``, default 0;
  with ``top_k = 1`` all tokens go to it and every other expert is empty) or
  ``"subset"`` (tokens are routed among the experts listed in ``experts``
  only; all others get no token);
* ``garbage`` (0 = off) and ``spare`` (8): the weights of every expert that no
  token is routed to are filled with values of magnitude ``garbage/2 ..
  garbage`` and random sign, and ``hidden_states`` is an exact-size view at the
  start of a buffer whose ``spare`` further rows hold such values too.  A kernel
  that multiplies by the wrong expert's weights, or that reads token rows past
  ``num_tokens`` for padding slots and lets them reach the output, gets a wildly
  wrong answer.

``output`` is created filled with NaN, so a kernel that leaves part of it
unwritten fails.
"""

from __future__ import annotations

import math

import torch

HIDDEN, W13, W2, WEIGHTS, IDS, OUTPUT = range(6)
TOKENS, HIDDEN_SIZE, INTER, EXPERTS, TOP_K = range(6, 11)


def _garble(shape, garbage: float, gen: torch.Generator, device: str) -> torch.Tensor:
    magnitude = torch.rand(shape, device=device, generator=gen) * 0.5 + 0.5
    sign = torch.randint(0, 2, shape, device=device, generator=gen) * 2 - 1
    return (garbage * magnitude * sign).to(torch.bfloat16)


def make_case(params: dict, device: str, seed: int) -> list:
    """The run_kernel argument list for one manifest case, deterministic in ``seed``."""
    tokens = int(params["num_tokens"])
    hidden = int(params["hidden_size"])
    inter = int(params["intermediate_size"])
    experts = int(params["num_experts"])
    top_k = int(params["top_k"])
    renormalize = bool(params.get("renormalize", 1))
    routing = str(params.get("routing", "softmax"))
    garbage = float(params.get("garbage", 0.0))
    spare = int(params.get("spare", 8)) if garbage else 0
    if not 1 <= top_k <= experts or tokens < 1:
        raise ValueError(f"need 1 <= top_k <= num_experts and num_tokens >= 1 (got {top_k}, {experts}, {tokens})")

    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    bf16 = torch.bfloat16
    x_buf = torch.randn(tokens + spare, hidden, dtype=bf16, device=device, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, dtype=bf16, device=device, generator=gen).mul_(hidden**-0.5)
    w2 = torch.randn(experts, hidden, inter, dtype=bf16, device=device, generator=gen).mul_(inter**-0.5)
    logits = torch.randn(tokens, experts, device=device, generator=gen)
    if routing == "one_expert":
        hot = int(params.get("hot", 0))
        logits[:, hot] = logits.max(dim=1).values + 1.0
    elif routing == "subset":
        allowed = torch.zeros(experts, dtype=torch.bool, device=device)
        allowed[[int(e) for e in params["experts"]]] = True
        if int(allowed.sum()) < top_k:
            raise ValueError("routing 'subset' needs at least top_k experts")
        logits = logits.masked_fill(~allowed, -math.inf)
    elif routing != "softmax":
        raise ValueError(f"unknown routing {routing!r} (softmax, one_expert, subset)")
    probs = torch.softmax(logits, dim=-1)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    topk_weights = topk_weights.float().contiguous()
    topk_ids = topk_ids.to(torch.int32).contiguous()

    if garbage:
        used = torch.zeros(experts, dtype=torch.bool, device=device)
        used[topk_ids.reshape(-1).long()] = True
        for e in (~used).nonzero().flatten().tolist():
            w13[e] = _garble(w13[e].shape, garbage, gen, device)
            w2[e] = _garble(w2[e].shape, garbage, gen, device)
        x_buf[tokens:] = _garble((spare, hidden), garbage, gen, device)
    x = x_buf[:tokens]  # a contiguous view: any garbage rows lie just past its end
    output = torch.full((tokens, hidden), math.nan, dtype=bf16, device=device)
    return [x, w13, w2, topk_weights, topk_ids, output, tokens, hidden, inter, experts, top_k]


def reference(args: list, dtype: torch.dtype) -> list:
    """``[output]`` computed with plain PyTorch entirely in ``dtype``; ``args`` is left untouched."""
    x, w13, w2 = args[HIDDEN], args[W13], args[W2]
    weights, ids = args[WEIGHTS], args[IDS].long()
    inter = int(args[INTER])
    x = x.to(dtype)
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=dtype, device=x.device)
    for expert in torch.unique(ids).tolist():
        tokens, slots = (ids == expert).nonzero(as_tuple=True)
        h = x[tokens] @ w13[expert].to(dtype).t()
        act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = act @ w2[expert].to(dtype).t()
        out.index_add_(0, tokens, y * weights[tokens, slots].to(dtype)[:, None])
    return [out]


def _active(args: list) -> list[int]:
    return torch.unique(args[IDS].long()).tolist()


def bytes_moved(args: list) -> int:
    """The tokens, the weights of every expert some token uses (once), the routing tensors and the output."""
    x, w13, w2, out = args[HIDDEN], args[W13], args[W2], args[OUTPUT]
    per_expert = w13[0].numel() * w13.element_size() + w2[0].numel() * w2.element_size()
    routing = args[WEIGHTS].numel() * args[WEIGHTS].element_size() + args[IDS].numel() * args[IDS].element_size()
    return int(x.numel() * x.element_size() + len(_active(args)) * per_expert + routing
               + out.numel() * out.element_size())


def flops(args: list) -> int:
    """Per (token, expert) pair: 2*H*2I for gate/up and 2*I*H for down."""
    pairs = int(args[TOKENS]) * int(args[TOP_K])
    return 6 * pairs * int(args[HIDDEN_SIZE]) * int(args[INTER])


def describe(args: list) -> str:
    return (f"T={int(args[TOKENS])} H={int(args[HIDDEN_SIZE])} I={int(args[INTER])} "
            f"top{int(args[TOP_K])}/{int(args[EXPERTS])} used={len(_active(args))}")
