"""The fast GGUF tensor table against the gguf package's own reader, on a file it writes."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize

from shared.errors import UnsupportedModel
from shared.model.gguf_index import read_tensors


def write_gguf(path, alignment: int | None = None) -> None:
    writer = GGUFWriter(str(path), "llama")
    if alignment:
        writer.add_custom_alignment(alignment)
    writer.add_token_list([f"tok{i}" for i in range(300)])  # an array of strings to skip
    writer.add_array("test.floats", [0.5, 1.5])
    writer.add_bool("test.flag", True)
    rng = np.random.default_rng(0)
    writer.add_tensor("norm.weight", rng.standard_normal(64).astype(np.float32))
    q8 = quantize(rng.standard_normal((5, 96)).astype(np.float32), GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("alignment", [None, 64])
def test_tensors_are_where_the_gguf_package_finds_them(tmp_path, alignment) -> None:
    path = tmp_path / "t.gguf"
    write_gguf(path, alignment)
    ours, theirs = read_tensors(path), GGUFReader(path).tensors
    assert [t.name for t in ours] == [t.name for t in theirs]
    for mine, reference in zip(ours, theirs):
        assert mine.ggml_type == int(reference.tensor_type)
        assert mine.shape == tuple(int(n) for n in reversed(reference.shape))
        expected = np.asarray(reference.data).view(np.uint8).reshape(mine.data.shape)
        np.testing.assert_array_equal(mine.data, expected)
    assert ours[1].shape == (5, 96) and ours[1].data.shape == (5, 3 * 34)


def test_a_file_that_is_not_gguf_is_refused(tmp_path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(UnsupportedModel, match="not a GGUF"):
        read_tensors(path)
