"""The static scan reports every violation at once, each with its line, in plain words; reading a
module's version string is no violation; and the prompt states the rules before a rejection."""

from __future__ import annotations

from optagent.integrity import static_verdict
from optagent.schema import Language
from optagent.llm.feedback import scan_rules
from optagent.llm.prompts import render

KERNEL = '''import triton
import triton.language as tl

NEW = int(triton.__version__.split(".")[0]) >= 3


@triton.jit
def _k(x_ptr):
    pass


def run_kernel(x):
    _k[(1,)](x)
'''


def test_a_version_string_is_no_violation():
    assert static_verdict(KERNEL, Language.TRITON) is None
    assert static_verdict(KERNEL.replace("triton.__version__", "torch.__version__").replace(
        "import triton\n", "import torch\nimport triton\n", 1), Language.TRITON) is None


def test_every_violation_is_named_with_its_line():
    bad = KERNEL.replace("import triton.language as tl\n", "import triton.language as tl\nimport os\n") + (
        "    eval('1')\n    y = x.__class__\n    return torch.softmax(x, 0)\n")
    why = static_verdict(bad, Language.TRITON)
    assert why.startswith("line 3: imports os (processes, files and the environment)"), why
    assert "line 15: runs dynamic code (eval)" in why
    assert "line 16: reaches into Python's interpreter internals through the dunder attribute __class__" in why
    assert "line 17: computes with PyTorch on the host (torch.softmax)" in why
    assert why.count("line ") == 4


def test_no_kernel_is_said_beside_the_scan():
    why = static_verdict("import os\n\ndef run_kernel(x):\n    pass\n", Language.TRITON)
    assert why.startswith("line 1: imports os") and why.endswith("defines no triton kernel of its own")


def test_the_system_prompt_states_the_scan_rules():
    text = render("system", language="triton", gpu=None, on_cpu=True, hidden_cases=True, allowed_imports=["math", "torch", "triton"],
                  scan=scan_rules(Language.TRITON), fence="python")
    assert "every violation named with its line" in text and "`__version__` is fine" in text
    assert "eval" in text and "torch.{backends, " in text and "nn," in text and "softmax" in text and "touches the timer" in text
    cuda = render("system", language="cuda", gpu=None, on_cpu=False, hidden_cases=False, allowed_imports=[],
                  scan=scan_rules(Language.CUDA), fence="cuda")
    assert "scanned before it is compiled" in cuda and "runs other programs" in cuda
