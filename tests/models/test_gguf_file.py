"""`jaxgrpo.models.gguf_file` reads what gguf-py's `GGUFReader` reads: every metadata value (as `contents()` gives
it, with its Python type) and every tensor (name, type, ggml shape, bytes), on the shipped checkpoints and on files
gguf-py writes in both byte orders with every value type; a file that is not GGUF or is cut short is refused."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from jaxgrpo.models import gguf_file, registry
from jaxgrpo.models.weights import WeightFileError


def _assert_reads_as_gguf_py(path):
    metadata, tensors = gguf_file.read(str(path))
    reader = GGUFReader(str(path))
    expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(metadata) == list(expected)
    for key, value in expected.items():
        assert metadata[key] == value and type(metadata[key]) is type(value), key
        if isinstance(value, list):
            assert [type(v) for v in metadata[key]] == [type(v) for v in value], key
    assert [t.name for t in tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(tensors, reader.tensors):
        assert ours.tensor_type == theirs.tensor_type and list(ours.shape) == theirs.shape.tolist(), ours.name
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape, ours.name
        np.testing.assert_array_equal(ours.data, theirs.data)
    return metadata, tensors


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma3-270m"])
def test_the_shipped_checkpoints_read_as_gguf_py_reads_them(name):
    metadata, tensors = _assert_reads_as_gguf_py(registry.resolve(name))
    assert len(metadata["tokenizer.ggml.tokens"]) > 40_000 and len(tensors) > 200


def _write(path, endianess):
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), "llama", endianess=endianess)
    writer.add_uint8("u8", 7)
    writer.add_key_value("i16", -3, GGUFValueType.INT16)
    writer.add_key_value("u64", 2**40 + 1, GGUFValueType.UINT64)
    writer.add_key_value("i64", -(2**40), GGUFValueType.INT64)
    writer.add_key_value("f64", 0.1, GGUFValueType.FLOAT64)
    writer.add_float32("f32", 0.1)
    writer.add_bool("flag", True)
    writer.add_string("text", "héllo ▁world")
    writer.add_array("strings", ["a", "", "▁b", "ü" * 40])
    writer.add_array("floats", [0.5, -1.25])
    writer.add_array("empty", [])
    weights = rng.standard_normal((4, 64)).astype(np.float32)
    writer.add_tensor("plain.weight", weights)
    writer.add_tensor("half.weight", weights.astype(np.float16))
    if endianess == GGUFEndian.LITTLE:  # gguf-py writes quantized blocks little-endian only
        q8 = GGMLQuantizationType.Q8_0
        writer.add_tensor("q8.weight", quantize(weights, q8), raw_dtype=q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


@pytest.mark.parametrize("endianess", [GGUFEndian.LITTLE, GGUFEndian.BIG], ids=["little", "big"])
def test_every_value_type_and_byte_order_reads_as_gguf_py_reads_it(tmp_path, endianess):
    path = tmp_path / "model.gguf"
    weights = _write(path, endianess)
    metadata, tensors = _assert_reads_as_gguf_py(path)
    assert metadata["strings"] == ["a", "", "▁b", "ü" * 40] and metadata["u64"] == 2**40 + 1
    np.testing.assert_array_equal(tensors[0].data, weights)


def test_a_file_that_is_not_gguf_or_is_cut_short_is_refused(tmp_path):
    path = tmp_path / "model.gguf"
    _write(path, GGUFEndian.LITTLE)
    whole = path.read_bytes()
    for size, message in ((len(whole) - 100, "runs past the end of the file"), (200, "cut short"),
                          (10, "not a GGUF file")):
        path.write_bytes(whole[:size])
        with pytest.raises(ValueError, match=message):
            gguf_file.read(str(path))
    path.write_bytes(b"PK\x03\x04" + whole[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_file.read(str(path))
    from jaxgrpo.models import load_config

    with pytest.raises(WeightFileError, match=f"cannot read GGUF file {path}: not a GGUF file"):
        load_config(str(path))
