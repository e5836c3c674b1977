"""``.safetensors`` checkpoints, read by the safetensors package, with one-line reasons for damaged files.

A safetensors file is an 8-byte little-endian header length, a JSON header naming every tensor's dtype,
shape and byte range, then the bytes. The package refuses a file whose header and bytes disagree;
its messages (``incomplete metadata, file not fully covered``) do not say whether the file was cut
short, so when it refuses, the header's own byte count is compared with the file's size here.
"""

from __future__ import annotations

import json
import os
import struct

from safetensors import SafetensorError, safe_open

SUFFIX = ".safetensors"
_LENGTH = 8  # bytes of the header-length prefix
TORCH_MAGIC = (b"PK\x03\x04", b"\x80")  # torch's zip container, a legacy pickle


def is_safetensors(path: str) -> bool:
    """``path`` starts like a safetensors file (a length, then the JSON header's ``{``: neither torch's
    zip archive nor a pickle has a ``{`` there), or is named ``*.safetensors`` and does not start
    like torch's files (a damaged safetensors file may have lost its header)."""
    with open(path, "rb") as f:
        head = f.read(_LENGTH + 1)
    if head[_LENGTH:] == b"{":
        return True
    return path.endswith(SUFFIX) and not head.startswith(TORCH_MAGIC)


class SafetensorsTensors(dict):
    """A safetensors file's tensors by name, with its header's string ``metadata`` (``{}`` when none)."""

    metadata: dict[str, str]


def load_safetensors(path: str) -> SafetensorsTensors:
    """Every tensor of a safetensors file on CPU and its header's metadata, the file opened once; a
    one-line ``ValueError`` naming the file when the package refuses it (truncated, a header that
    disagrees with the bytes, not safetensors at all)."""
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            tensors = SafetensorsTensors((key, f.get_tensor(key)) for key in f.keys())
            tensors.metadata = dict(f.metadata() or {})
    except SafetensorError as err:
        raise ValueError(f"{path}: {_damage(path, err)}") from err
    return tensors


def _damage(path: str, err: SafetensorError) -> str:
    """Why the package refused ``path``, in words a user can act on."""
    size = os.path.getsize(path)
    if size == 0:
        return "is empty (0 bytes), not a checkpoint (an interrupted download or copy?)"
    with open(path, "rb") as f:
        prefix = f.read(_LENGTH)
        length = struct.unpack("<Q", prefix)[0] if len(prefix) == _LENGTH else None
        first = f.read(1)
    truncated = (
        f"is truncated ({size} bytes{{}}, the end of the safetensors file is missing: an interrupted save, "
        "download or copy?)"
    )
    if length is None or (first == b"{" and _LENGTH + length > size):
        return truncated.format("")
    if first != b"{":
        return f"is not a safetensors file (no JSON header after its first {_LENGTH} bytes; {size} bytes)"
    with open(path, "rb") as f:
        f.seek(_LENGTH)
        try:
            entries = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "its safetensors header is not valid JSON (a damaged or edited file); get the file again"
    ends = [
        e["data_offsets"][1]
        for k, e in entries.items()
        if k != "__metadata__" and isinstance(e, dict) and len(e.get("data_offsets", ())) == 2
    ]
    declared = _LENGTH + length + max(ends, default=0)
    if declared > size:
        return truncated.format(f" of the {declared} its header lists")
    reason = str(err).split(":", 1)[-1].strip()
    return (
        f"its safetensors header does not match its {size} bytes ({reason}): the header lies about a tensor's "
        "shape, dtype or place (a damaged or edited file); get the file again"
    )
