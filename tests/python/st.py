"""A small reader and writer for the safetensors format, so that the PyTorch references can
exchange tensors with meshtrain without the safetensors package.

File layout: an 8-byte little-endian unsigned header length N, N bytes of JSON
  {name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
   "__metadata__": {str: str}}
then the data; offsets are relative to the first byte after the header.

    tensors, metadata = st.load(path)
    st.save(path, {"wte.weight": t, ...}, metadata={"n_head": "4"})
"""
import json
import os
import struct

import torch

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_MAX_HEADER = 100 << 20


def _element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def load(path):
    """Returns ({name: tensor}, metadata) with tensors in file order; raises ValueError on a
    malformed file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > _MAX_HEADER or 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} does not fit the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data = bytearray(blob[8 + n:])
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        shape = [int(d) for d in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
        count = 1
        for d in shape:
            if d < 0:
                raise ValueError(f"{path}: tensor {name!r} has a negative dimension")
            count *= d
        if not (0 <= begin <= end <= len(data)) or end - begin != count * _element_size(dtype):
            raise ValueError(f"{path}: tensor {name!r} has bad data offsets {begin}, {end}")
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(data, dtype=dtype, count=count,
                                             offset=begin).reshape(shape).clone()
    return tensors, metadata


def _tensor_bytes(t):
    t = t.detach().to("cpu").contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.view(torch.int16)  # numpy has no bfloat16; same bytes
    return t.numpy().tobytes()


def save(path, tensors, metadata=None):
    """Writes {name: tensor} (in dict order) and optional {str: str} metadata; the file appears
    complete or not at all (written aside, then renamed)."""
    header = {}
    chunks = []
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in _NAMES:
            raise ValueError(f"tensor {name!r} has unsupported dtype {t.dtype}")
        raw = _tensor_bytes(t)
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)
