"""The digests the judge compares (worker/digests.py): every byte counts, in place, and a pass's split does not."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from optagent.worker import digests


def test_the_mixed_sums_do_not_depend_on_how_the_words_are_split_into_passes():
    words = digests._words(torch.randn(1000, 37).to(torch.bfloat16))
    whole = digests._mixed(words, 0)
    assert torch.equal(whole, digests._mixed(words[:123], 0) + digests._mixed(words[123:], 123))


def test_a_flipped_bit_or_moved_words_change_the_mixed_sums():
    words = digests._words(torch.arange(4096, dtype=torch.int64))
    flipped = words.clone()
    flipped[2000] ^= 1
    swapped = words.clone()
    swapped[[10, 11]] = swapped[[11, 10]]
    base = digests._mixed(words, 0)
    assert not torch.equal(base, digests._mixed(flipped, 0)) and not torch.equal(base, digests._mixed(swapped, 0))


def test_a_digest_names_every_tensor_and_byte():
    a, b = torch.randn(7, 3), torch.arange(5, dtype=torch.int8)
    d = digests.outputs_digest({0: a, 2: b})
    assert d == digests.outputs_digest({0: a.clone(), 2: b.clone()}) and len(d) == 64
    assert d != digests.outputs_digest({0: a, 3: b})  # another argument
    changed = b.clone()
    changed[4] += 1
    assert d != digests.outputs_digest({0: a, 2: changed})


@pytest.mark.gpu
def test_the_device_digest_over_several_passes_is_steady_and_sees_the_last_word():
    t = torch.randn(3 * digests.DIGEST_CHUNK + 5, device="cuda")
    one = digests.outputs_digest({0: t})
    assert one == digests.outputs_digest({0: t.clone()})
    t[-1] += 1
    assert one != digests.outputs_digest({0: t})


@pytest.mark.parametrize("shape", [(7, 5, 3), (1, 9), (1, 1, 16), (1000, 128), (2, 1)])
def test_the_in_place_redraw_is_the_judges_rebuild_bit_for_bit(shape):
    """The harness redraws its inputs after every timed call into their own memory (harness.move_into, two slice
    copies); the judge's rebuild of a call's inputs (harness.moved) must give the same bits for every seed."""
    from optagent.worker.harness import move_into, moved

    base = torch.randn(shape, dtype=torch.float32).to(torch.bfloat16)
    for seed in range(20):
        dst = torch.full_like(base, float("nan"))
        move_into(dst, base, seed)
        assert torch.equal(dst.view(torch.int16), moved(base, seed).contiguous().view(torch.int16)), (shape, seed)
    strided = torch.randn(shape[::-1]).permute(*reversed(range(len(shape))))  # not contiguous: rolled, as before
    dst = torch.empty_like(strided)
    move_into(dst, strided, 3)
    assert torch.equal(dst, moved(strided, 3))


def _ptx_lines(text: str) -> list[str]:
    """A PTX text's instructions and directives: nvcc's comments and its .version line left out."""
    return [line.rstrip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("//") and not line.startswith(".version")]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_the_digest_kernels_ptx_is_nvccs_build_of_its_source(tmp_path):
    """timer.c carries the digest kernel as PTX (native/digest_ptx.h): it must be digest.cu's, not an older edit."""
    native = Path(digests.__file__).parent / "native"
    out = tmp_path / "digest.ptx"
    subprocess.run(["nvcc", "-ptx", "-arch=compute_75", "-O3", str(native / "digest.cu"), "-o", str(out)],
                   check=True, capture_output=True, timeout=300)
    header = (native / "digest_ptx.h").read_text()
    carried = "".join(ast.literal_eval(s) for s in re.findall(r'^\s*(".*")$', header, re.M))
    assert ".version 7.0" in carried
    assert _ptx_lines(carried) == _ptx_lines(out.read_text())


@pytest.mark.gpu
def test_the_native_digest_kernel_gives_the_formulas_sums(tmp_path):
    """The harness digests with timer.c's kernel, the judge with the torch formula: they must agree on every size,
    dtype and pass boundary, and a tensor the kernel cannot take (unaligned) goes through the formula."""
    from optagent.evaluation.native_build import native_timer
    from test_native_timer import in_child  # tests/ is on sys.path

    spec = native_timer(tmp_path)
    assert spec is not None
    got = in_child(Path(spec.path), '''
        import torch
        from optagent.worker import digests
        m.init(sr, rw, True, 2, 3, 1, 0.0)
        torch.empty(1, device="cuda")
        m.cuda_setup()
        tensors = [torch.randn(n, device="cuda").to(dt) for n in (1, 3, 8, 31, 256, 257, 4099, 1 << 20,
                   3 * digests.DIGEST_CHUNK + 5) for dt in (torch.float32, torch.bfloat16)]
        tensors += [torch.zeros(0, device="cuda"), torch.randint(-9, 9, (77, 13), device="cuda", dtype=torch.int8),
                    torch.randn(64, 128, device="cuda")[:, 3:67]]  # empty, odd bytes, not contiguous
        formula = [digests.outputs_digest({0: t}) for t in tensors]
        digests.use_native(m.digest)
        native = [digests.outputs_digest({0: t}) for t in tensors]
        words = digests._words(torch.randn(4096, device="cuda"))
        sums = list(m.digest(words.data_ptr(), words.numel()))
        still = digests._native is not None
        digests.use_native(None)
        print(json.dumps({"same": [a == b for a, b in zip(formula, native)], "still": still,
                          "sums": sums == digests._gpu_sums(words)}))
    ''')
    assert all(got["same"]) and got["sums"] and got["still"], got
