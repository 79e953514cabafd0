"""What ``optagent eval`` says of a kernel file that is not valid source: a syntax error with its
line (not "defines no kernel"), and a binary file as one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from optagent.integrity import python_syntax_error
from optagent.cli.main import main

# Cut off before its @triton.jit: the static scan alone would call it a file with no kernel.
TRUNCATED = '''import torch
import triton
import triton.language as tl


def _helper(x,
'''


@pytest.fixture()
def kernel(tmp_path):
    def write(name: str, data: bytes) -> Path:
        path = tmp_path / name
        path.write_bytes(data)
        return path
    return write


def _eval(task_dir: Path, path: Path, *extra: str) -> int:
    return main(["eval", str(task_dir), str(path), "--device", "cpu", "--no-hidden", *extra])


def test_syntax_error_names_itself_and_its_line(task_dir, kernel, capsys):
    path = kernel("cut.py", TRUNCATED.encode())
    assert _eval(task_dir, path) == 1
    out = capsys.readouterr().out
    assert "COMPILE_ERROR" in out and "SyntaxError: '(' was never closed (line 6): def _helper(x," in out
    assert "defines no" not in out


@pytest.mark.parametrize("data, why", [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00" * 20, "it holds NUL bytes"),
    (b"import triton\n\xff\xfe\xfa garbage\n", "not UTF-8 text"),
    (b"import triton\n\x00\n@triton.jit\ndef k():\n    pass\n", "it holds NUL bytes"),
])
@pytest.mark.parametrize("language", [[], ["--language", "triton"]])
def test_binary_file_is_not_a_kernel_source(task_dir, kernel, capsys, data, why, language):
    path = kernel("kernel.py", data)
    assert _eval(task_dir, path, *language) == 2
    said = capsys.readouterr()
    lines = said.err.strip().splitlines()
    assert len(lines) == 1 and lines[0] == f"optagent: error: {path}: not a kernel source (a binary file: {why})"
    assert said.out == ""


def test_syntax_error_lines():
    assert python_syntax_error("x = = 1\n") == "SyntaxError: invalid syntax (line 1): x = = 1"
    assert python_syntax_error("if x:\npass\n").startswith("SyntaxError: expected an indented block")
    assert python_syntax_error("a = 1\x00\n").startswith("SyntaxError: source code string cannot contain null bytes")
    assert "line None" not in python_syntax_error("a = 1\x00\n")
    assert python_syntax_error("x = 1\n") is None


def test_a_byte_order_mark_is_text(kernel):
    from optagent.cli.main import _read_kernel
    from optagent.schema import Language

    source, language = _read_kernel(kernel("bom.py", "\ufeffimport triton\nx = 1\n".encode()), None)
    assert source == "import triton\nx = 1\n" and language is Language.TRITON and python_syntax_error(source) is None
