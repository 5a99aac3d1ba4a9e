"""A GGUF file's metadata and tensors, read in one pass over its header.

gguf-py's `GGUFReader` keeps a numpy view of every part of every metadata value, so a vocabulary array costs it
several views per token: 12.8 s for Gemma 3's 262,144 tokens and 2.7 s for SmolLM2's 49,152 on a 2-core AMD EPYC,
every time a model, its config or its tokenizer is loaded. Here the header is read with `struct` and the values
come out as Python values, the same as gguf-py's `ReaderField.contents()` (tests/models/test_gguf_file.py holds
the two equal on every shipped checkpoint); the tensors are views of a read-only memory map, shaped as gguf-py
shapes them, for `gguf.dequantize`. Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import numpy as np

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_STRING, _ARRAY = 8, 9
#: GGUF's scalar value types and their `struct` formats (the byte order is set per file).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
#: Tensor types stored as plain numbers (the rest are quantized blocks, read as bytes).
_PLAIN = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


class Tensor(NamedTuple):
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # ggml's order, fastest axis first (as gguf-py gives it)
    data: np.ndarray  # numbers in numpy's order, or a quantized tensor's bytes, row by row (gguf-py's layout)


class _Cursor:
    def __init__(self, buffer, order: str):
        self.buffer, self.order, self.offset = buffer, order, 0

    def scalars(self, code: str, count: int = 1) -> tuple:
        values = struct.unpack_from(f"{self.order}{count}{code}", self.buffer, self.offset)
        self.offset += struct.calcsize(f"{self.order}{count}{code}")
        return values

    def scalar(self, code: str):
        return self.scalars(code)[0]

    def string(self) -> str:
        (length,) = struct.unpack_from(self.order + "Q", self.buffer, self.offset)
        start = self.offset + 8
        self.offset = start + length
        return bytes(self.buffer[start:self.offset]).decode("utf-8")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("I"), self.scalar("Q")
            if item == _STRING:
                return [self.string() for _ in range(count)]
            if item in _SCALARS:
                return list(self.scalars(_SCALARS[item], count))
            if item == _ARRAY:  # flattened, as gguf-py flattens nested arrays
                return [v for _ in range(count) for v in self.value(_ARRAY)]
            raise ValueError(f"unknown GGUF array item type {item}")
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        raise ValueError(f"unknown GGUF value type {kind}")


def read(path: str) -> tuple[dict[str, Any], list[Tensor]]:
    """(metadata, tensors) of the GGUF file at `path`: every key's value as gguf-py's `contents()` gives it, and the
    tensors in file order. Raises ValueError on a file that is not GGUF or is cut short."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape

    data = np.memmap(path, dtype=np.uint8, mode="r")
    if data.size < 24 or bytes(data[:4]) != _MAGIC:
        raise ValueError(f"not a GGUF file (its first bytes are {bytes(data[:4])!r}, not {_MAGIC!r})")
    (version,) = struct.unpack_from("<I", data, 4)
    order = "<" if version & 0xFFFF else ">"  # a file written on a machine of the other byte order
    cursor = _Cursor(memoryview(data), order)
    cursor.offset = 4
    version = cursor.scalar("I")
    if version not in _VERSIONS:
        raise ValueError(f"GGUF version {version} is not supported (supported: {', '.join(map(str, _VERSIONS))})")
    tensor_count, kv_count = cursor.scalars("Q", 2)
    try:
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string()
            if key in metadata:
                raise ValueError(f"the GGUF key {key!r} appears twice")
            metadata[key] = cursor.value(cursor.scalar("I"))
        infos = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = cursor.scalars("Q", cursor.scalar("I"))
            infos.append((name, dims, cursor.scalar("I"), cursor.scalar("Q")))
    except struct.error as error:
        raise ValueError(f"the GGUF header is cut short ({error})") from None
    alignment = metadata.get("general.alignment", 32)
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"general.alignment={alignment} is not a power of two")
    start = -(-cursor.offset // alignment) * alignment
    tensors, names = [], set()
    for name, dims, raw_type, offset in infos:
        if name in names:
            raise ValueError(f"the GGUF tensor {name!r} appears twice")
        names.add(name)
        kind = GGMLQuantizationType(raw_type)
        count = int(np.prod(dims, dtype=np.int64))
        shape = tuple(reversed(dims))
        dtype = _PLAIN.get(raw_type)
        if dtype is None:  # quantized blocks: the bytes of each row
            block, block_bytes = GGML_QUANT_SIZES[kind]
            nbytes, dtype, shape = count * block_bytes // block, np.uint8, quant_shape_to_byte_shape(shape, kind)
        else:
            nbytes = count * np.dtype(dtype).itemsize
        first = start + offset
        if first + nbytes > data.size:
            raise ValueError(f"the GGUF tensor {name!r} runs past the end of the file (is it cut short?)")
        array = data[first:first + nbytes].view(np.dtype(dtype).newbyteorder(order)).reshape(shape)
        tensors.append(Tensor(name, kind, tuple(int(d) for d in dims), array))
    return metadata, tensors
