"""SEARCH/REPLACE and whole-file parsing, applying, and idea extraction."""

from __future__ import annotations

import pytest

from optagent.llm.edits import EditError, apply_edits, kernel_from_reply
from optagent.llm.replies import Edit, NoKernelError, extract_idea, parse_edits, parse_reply

SOURCE = """import triton
import triton.language as tl

BLOCK_N = 16  # knob: 16, 32, 64


@triton.jit
def _kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x * 2, mask=offs < n)


def run_kernel(x, y, n):
    grid = (triton.cdiv(n, BLOCK_N),)
    _kernel[grid](x, y, n, BLOCK=BLOCK_N, num_warps=4)
    return y
"""


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


# ---------------------------------------------------------------- parsing


def test_parse_several_blocks_inside_fences_with_filename_lines():
    reply = (
        "IDEA: bigger tiles\n\nkernel.py\n```python\n"
        + block("BLOCK_N = 16  # knob: 16, 32, 64", "BLOCK_N = 64  # knob: 16, 32, 64")
        + "```\n\nand\n\n```python\n"
        + block("    _kernel[grid](x, y, n, BLOCK=BLOCK_N, num_warps=4)",
                "    _kernel[grid](x, y, n, BLOCK=BLOCK_N, num_warps=8)")
        + "```\n"
    )
    parsed = parse_reply(reply, "triton")
    assert parsed.kind == "edits" and [e.index for e in parsed.edits] == [1, 2]
    out = apply_edits(SOURCE, parsed.edits)
    assert "BLOCK_N = 64  # knob" in out and "num_warps=8" in out and "num_warps=4" not in out
    assert out.endswith("return y\n")  # the final newline survives


def test_crlf_reply_and_multi_line_block_with_deletion():
    reply = block("    x = tl.load(x_ptr + offs, mask=offs < n)\n"
                  "    tl.store(y_ptr + offs, x * 2, mask=offs < n)",
                  "    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)")
    out = apply_edits(SOURCE, parse_edits(reply.replace("\n", "\r\n")))
    assert "    x = tl.load" not in out and "tl.load(x_ptr + offs, mask=offs < n) * 2" in out
    deleted = apply_edits(SOURCE, [Edit("import triton.language as tl", "", 1)])
    assert "import triton.language" not in deleted


def test_unclosed_block_is_no_kernel():
    with pytest.raises(NoKernelError, match="not closed"):
        parse_reply("<<<<<<< SEARCH\nBLOCK_N = 16\n=======\nBLOCK_N = 32\n", "triton")


def test_whole_file_picks_longest_run_kernel_block_of_the_language():
    reply = ("IDEA: rewrite\n```python\nout = run_kernel(x, y, n)\n```\n"
             f"```python\n{SOURCE}```\nThat is all.")
    parsed = parse_reply(reply, "triton")
    assert parsed.kind == "file" and parsed.source == SOURCE


def test_whole_file_bare_and_cuda_fences():
    cu = 'extern "C" void run_kernel(float* x, int n) {}\n'
    assert parse_reply(f"```\n{cu}```", "cuda").source == cu
    for tag in ("cuda", "cpp", "c++"):
        assert parse_reply(f"```{tag}\n{cu}```", "cuda").source == cu
    with pytest.raises(NoKernelError, match="tagged ```python"):
        parse_reply(f"```python\n{SOURCE}```", "cuda")


@pytest.mark.parametrize("reply, reason", [
    ("", "empty"),
    ("I would increase BLOCK_N.", "neither SEARCH/REPLACE blocks nor a fenced code block"),
    ("```python\nprint('hi')\n```", "defines run_kernel"),
    (f"```python\n{SOURCE}", "not closed"),
])
def test_replies_without_a_kernel(reply, reason):
    with pytest.raises(NoKernelError, match=reason):
        parse_reply(reply, "triton")


def test_unchanged_kernel_is_no_kernel():
    with pytest.raises(NoKernelError, match="unchanged"):
        kernel_from_reply(f"```python\n{SOURCE}```", SOURCE, "triton")


# ---------------------------------------------------------------- applying


def test_not_found_names_block_and_shows_nearest_numbered_lines():
    edits = [Edit("BLOCK_N = 16  # knob: 16, 32, 64", "BLOCK_N = 32  # knob: 16, 32, 64", 1),
             Edit("    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)", "    offs = 0", 2)]
    with pytest.raises(EditError) as info:
        apply_edits(SOURCE, edits)
    msg = str(info.value)
    assert info.value.block == 2
    assert "block 2 of 2" in msg and "not found" in msg and "after block 1 was applied" in msg
    assert ">10 |     offs = pid * BLOCK + tl.arange(0, BLOCK)" in msg  # best window, numbered
    assert " 9 |     pid = tl.program_id(0)" in msg  # context line, unmarked


def test_several_exact_matches_is_an_error():
    src = "a = 1\nb = 2\na = 1\n"
    with pytest.raises(EditError, match=r"matches 2 places .*lines 1, 3"):
        apply_edits(src, [Edit("a = 1", "a = 3", 1)])


def test_whitespace_insensitive_fallback_when_unique_and_reindents():
    # The model dropped the indentation and added trailing spaces and a blank edge line.
    search = "\nx = tl.load(x_ptr + offs,  mask=offs < n)   \ntl.store(y_ptr + offs, x * 2, mask=offs < n)"
    replace = "\nx = tl.load(x_ptr + offs, mask=offs < n, other=0.0)\ntl.store(y_ptr + offs, x * 2, mask=offs < n)"
    out = apply_edits(SOURCE, [Edit(search, replace, 1)])
    assert "    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)\n    tl.store(" in out
    assert out.count("\n") == SOURCE.count("\n")


def test_whitespace_insensitive_fallback_refused_when_ambiguous():
    src = "if a:\n    x = 1\nif b:\n        x = 1\n"
    with pytest.raises(EditError, match="ignoring whitespace it matches 2 places"):
        apply_edits(src, [Edit("x = 1", "x = 2", 1)])


def test_empty_search_is_an_error():
    with pytest.raises(EditError, match="SEARCH section is empty"):
        apply_edits(SOURCE, [Edit("", "x = 1", 1)])


def test_nearest_lines_window_is_capped_for_long_search():
    search = "\n".join(f"line {i}" for i in range(100))
    with pytest.raises(EditError) as info:
        apply_edits(SOURCE, [Edit(search, "", 1)])
    assert "more lines" in str(info.value) and len(str(info.value).splitlines()) < 90


# ---------------------------------------------------------------- ideas


@pytest.mark.parametrize("reply, idea", [
    ("Some thinking.\nIDEA: use BLOCK_N=64 for long sequences\n<<<<<<< SEARCH", "use BLOCK_N=64 for long sequences"),
    ("**IDEA:** split the KV loop across programs", "split the KV loop across programs"),
    ("idea: lower-case works too", "lower-case works too"),
    ("Use a larger tile. It halves the loop trips.\n```python\nx\n```", "Use a larger tile."),
    ("```python\nIDEA = 3\n```\n## Fuse the softmax scaling into Q", "Fuse the softmax scaling into Q"),
    ("<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n", ""),
])
def test_extract_idea(reply, idea):
    assert extract_idea(reply) == idea


def test_extract_idea_is_clipped():
    idea = extract_idea("IDEA: " + "x" * 300)
    assert len(idea) == 120 and idea.endswith("…")


def test_a_quoted_search_line_keeps_its_own_indentation_behind_a_margin():
    """A model counted the quote's indent as its own (25 spaces where it wrote 21): the quote has a margin."""
    from optagent.llm.edits import EditError, apply_edits
    from optagent.llm.replies import parse_edits

    with pytest.raises(EditError) as e:
        apply_edits("def f():\n    x = 1\n", parse_edits("<<<<<<< SEARCH\n     x = 2\n=======\n    x = 3\n>>>>>>> REPLACE\n"))
    assert "\n  |      x = 2\n" in str(e.value)  # "  | " then the five spaces the SEARCH line has
