"""A tiny contest-format package with a manifest and hooks (out = 2 * x + 1), for the extension point's tests.

Its starter is naive (one 16-element block per program: hundreds of programs under Triton's
CPU interpreter); ``with_strategy`` adds the package's own ``strategies/`` folder with a
kernel that does the same work in a single program.
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIG = '''
import sys
CASES = [(4096,), (10000,)]


def getNumOfTestcases():
    return len(CASES)


try:
    import torch
    CURRENT = None

    def getTestCaseSize():
        global CURRENT
        CURRENT = CASES[int(input().strip()) - 1]
        return [CURRENT, CURRENT, ()], (2, 5)

    def genTestCase(sizes, device):
        g = torch.Generator().manual_seed(3)
        n = CURRENT[0]
        return [torch.randn(n, generator=g).to(device), torch.empty(n, device=device), n]

    def baseline(x, out, n):
        out.copy_(x * 2.0 + 1.0)
        return [x, out, n]

    def check(sizes, original, target, ref):
        ok = torch.allclose(target[1], ref[1], rtol=1e-5, atol=1e-5)
        if not ok:
            print("[FAIL] affine mismatch", file=sys.stderr)
        return ok
except Exception:
    pass
'''

HOOKS = '''import torch


def make_case(params: dict, device: str, seed: int) -> list:
    g = torch.Generator().manual_seed(int(seed))
    n = int(params["n"])
    return [torch.randn(n, generator=g).to(device), torch.full((n,), float("nan"), device=device), n]


def reference(args: list, dtype: torch.dtype) -> list:
    return [args[0].to(dtype) * 2 + 1]


def bytes_moved(args: list) -> int:
    return 2 * args[0].numel() * args[0].element_size()


def flops(args: list) -> int:
    return 0


def describe(args: list) -> str:
    return f"n={args[2]}"
'''

MANIFEST = '''[task]
name = "tiny_affine"
outputs = [1]
hooks = "optagent_hooks.py"

[[smoke]]
n = 4096

[[hidden]]
n = 1000
'''

NAIVE = '''import triton
import triton.language as tl


@triton.jit
def _affine(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


def run_kernel(x, out, n):
    _affine[(triton.cdiv(n, 16),)](x, out, n, BLOCK=16)
'''

FAST = '''import triton
import triton.language as tl


@triton.jit
def _affine_wide(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


BLOCK = 4096  # knob: 1024, 2048, 4096


def run_kernel(x, out, n):
    _affine_wide[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
'''

STRATEGY_TOML = '''# the package's own strategy folder (docs/task-format.md)
signature = ["x", "out", "n"]

[[strategy]]
name = "tiny_wide_blocks"
file = "wide.py"
language = "triton"
idea = "one program per 4096 elements instead of one per 16"
'''


def tiny_package(root: Path, hooks: str = HOOKS, manifest: str = MANIFEST) -> Path:
    docs = root / "xpuoj_problem" / "en"
    docs.mkdir(parents=True)
    (root / "xpuoj_problem" / "meta.json").write_text(json.dumps({"id": 1, "samples": [{"inputData": "1\n"}]}))
    (root / "xpuoj_problem" / "testcase_config.py").write_text(CONFIG)
    (docs / "_title.txt").write_text("Tiny affine")
    (docs / "00_statement.md").write_text('---\nsectionTitle: "Statement"\ntype: "Text"\n---\nout = 2 * x + 1\n')
    (docs / "01_contract.triton.md").write_text(
        '---\nsectionTitle: "Contract"\ntype: "codeSample"\nlang: "triton"\n---\n`run_kernel(x, out, n)`\n')
    (root / "starter").mkdir()
    (root / "starter" / "naive.py").write_text(NAIVE)
    (root / "optagent.toml").write_text(manifest)
    (root / "optagent_hooks.py").write_text(hooks)
    return root


def with_strategy(root: Path, toml: str = STRATEGY_TOML, kernel: str = FAST) -> Path:
    folder = root / "strategies"
    folder.mkdir(parents=True)
    (folder / "strategy.toml").write_text(toml)
    (folder / "wide.py").write_text(kernel)
    return root
