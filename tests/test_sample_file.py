"""A saved sample's file (worker/sample_file.py): what the harness writes the judge reads back bit for bit, and
a file rewritten since, or not laid out as the harness lays it out, is refused with the reason."""

from __future__ import annotations

import json
import os
import struct
import threading

import pytest
import torch

from optagent.worker import sample_file
from optagent.worker.sample_file import MAGIC, SampleFileError


def saved(tmp_path, outputs, inputs=None):
    path = tmp_path / "case-given.pt"
    return path, sample_file.write(path, outputs, inputs)


def read(path, expected, device="cpu"):
    fd = os.open(path, os.O_RDONLY)
    try:
        return sample_file.read(fd, device, expected)
    finally:
        os.close(fd)


def test_outputs_come_back_bit_for_bit_whatever_their_dtype_shape_and_layout(tmp_path):
    g = torch.Generator().manual_seed(3)
    outputs = {
        3: torch.randn(37, 129, generator=g).to(torch.bfloat16),
        0: torch.randint(-9, 9, (5, 3, 7), generator=g, dtype=torch.int32).transpose(0, 2),  # not contiguous
        5: torch.tensor(2.5, dtype=torch.float64),  # a 0-d tensor
        7: torch.zeros(0, 4, dtype=torch.float16),
        9: torch.rand(11, generator=g) > 0.5,
    }
    path, digest = saved(tmp_path, outputs, {1: "(4,):torch.float32:1:2"})
    back = read(path, digest)
    assert sorted(k for k in back if isinstance(k, int)) == [0, 3, 5, 7, 9]
    for i, t in outputs.items():
        assert back[i].dtype == t.dtype and back[i].shape == t.shape and torch.equal(back[i], t)
    assert back["inputs"] == {1: "(4,):torch.float32:1:2"}
    back[3].add_(1)  # a private mapping: the judge may write the tensors, the file stays as saved
    assert torch.equal(read(path, digest)[3], outputs[3])


def test_without_inputs_the_checksums_read_none(tmp_path):
    path, digest = saved(tmp_path, {0: torch.ones(3)})
    assert read(path, digest)["inputs"] is None


def test_the_digest_covers_every_chunk_and_the_header(tmp_path, monkeypatch):
    monkeypatch.setattr(sample_file, "CHUNK", 1 << 12)  # many chunks, on several threads
    big = torch.arange(50_000, dtype=torch.float32)
    path, digest = saved(tmp_path, {2: big})
    assert digest == sample_file.digest(*_split(path.read_bytes()))
    raw = bytearray(path.read_bytes())
    for where in (len(raw) - 1, len(raw) // 2, len(MAGIC) + 12):  # the last chunk, a middle one, the header
        bad = bytearray(raw)
        bad[where] ^= 1
        path.write_bytes(bytes(bad))
        with pytest.raises(SampleFileError) as e:
            read(path, digest)
        assert e.value.rewritten
    path.write_bytes(bytes(raw))
    assert torch.equal(read(path, digest)[2], big)


def test_a_write_leaves_no_thread_running(tmp_path, monkeypatch):
    monkeypatch.setattr(sample_file, "CHUNK", 1 << 10)
    before = set(threading.enumerate())
    saved(tmp_path, {0: torch.randn(4096)})
    assert set(threading.enumerate()) == before


def _split(data: bytes) -> tuple[memoryview, memoryview]:
    (n,) = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8 + n
    start += -start % sample_file.ALIGN
    return memoryview(data[:start]), memoryview(data[start:])


def forged(path, header: dict, data: bytes) -> str:
    """A file laid out as the harness's, with this header and data, and its own correct digest: what a candidate
    that writes the file itself and reports that digest hands the judge."""
    text = json.dumps(header).encode()
    head = MAGIC + struct.pack("<Q", len(text)) + text
    head += b"\0" * (-len(head) % sample_file.ALIGN)
    path.write_bytes(head + data)
    return sample_file.digest(memoryview(head), memoryview(data))


@pytest.mark.parametrize("entry, why", [
    ({"index": 0, "dtype": "object", "shape": [2], "offset": 0, "nbytes": 8}, "object"),
    ({"index": 0, "dtype": "float32", "shape": [4], "offset": 0, "nbytes": 8}, "not where"),  # nbytes != shape
    ({"index": 0, "dtype": "float32", "shape": [2], "offset": 64, "nbytes": 8}, "not where"),  # past the data
    ({"index": 0, "dtype": "float32", "shape": [2], "offset": 4, "nbytes": 8}, "not where"),  # unaligned
    ({"index": 0, "dtype": "float32", "shape": [-2], "offset": 0, "nbytes": 8}, "negative"),
    ({"index": 0, "dtype": "float32", "shape": "22", "offset": 0, "nbytes": 8}, "not where"),
    ({"dtype": "float32", "shape": [2], "offset": 0, "nbytes": 8}, "index"),
])
def test_a_header_not_the_harness_s_is_refused(tmp_path, entry, why):
    path = tmp_path / "forged.pt"
    digest = forged(path, {"tensors": [entry], "inputs": None}, b"\0" * 8)
    with pytest.raises(SampleFileError) as e:
        read(path, digest)
    assert not e.value.rewritten and why in str(e.value)


def test_a_tensor_named_twice_or_a_short_file_is_refused(tmp_path):
    path = tmp_path / "forged.pt"
    entry = {"index": 1, "dtype": "uint8", "shape": [8], "offset": 0, "nbytes": 8}
    digest = forged(path, {"tensors": [entry, entry], "inputs": None}, b"\1" * 8)
    with pytest.raises(SampleFileError, match="not where"):
        read(path, digest)
    path.write_bytes(MAGIC[:5])
    with pytest.raises(SampleFileError, match="shorter"):
        read(path, "0" * 64)
    path.write_bytes(b"x" * 100)
    with pytest.raises(SampleFileError, match="not a file"):
        read(path, "0" * 64)
    path.write_bytes(MAGIC + struct.pack("<Q", 1 << 40))
    with pytest.raises(SampleFileError, match="runs past"):
        read(path, "0" * 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_outputs_go_through_the_staging_buffer_and_come_back_on_the_gpu(tmp_path):
    outputs = {0: torch.randn(4096, 1024, device="cuda").to(torch.bfloat16), 1: torch.arange(7, device="cuda")}
    path, digest = saved(tmp_path, outputs)
    first = sample_file._staging
    assert first is not None and first.is_pinned()
    back = read(path, digest, "cuda")
    assert all(back[i].is_cuda and torch.equal(back[i], t) for i, t in outputs.items())
    saved(tmp_path, {0: outputs[1]})
    assert sample_file._staging is first  # kept, not made again
