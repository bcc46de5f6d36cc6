"""The pipe between fsdp-lint and its fork server: 8-byte length + pickle."""
from __future__ import annotations

import pickle
import select
import socket
import struct
import time
from typing import List, Optional

_HEADER = struct.Struct("!Q")

class _PlainPickler(pickle.Pickler):
    """Pickles values of the linted code's own types as the builtin values they are: a ``StrEnum`` mesh
    dimension name (``MeshAxisName.DP``) as its ``str``, an ``IntEnum`` as its ``int``, another enum
    member as its value -- the parent cannot import the project's modules to unpickle them."""

    def reducer_override(self, obj):
        import enum

        if isinstance(obj, bool) or type(obj) in (str, int, float, bytes):
            return NotImplemented
        for base in (str, int, float, bytes):
            if isinstance(obj, base):
                return base, (base.__str__(obj) if base is str else base(obj),)
        if isinstance(obj, enum.Enum):
            value = obj.value
            return (type(value), (value,)) if type(value) in (str, int, float) else (str, (obj.name,))
        return NotImplemented


def plain_dumps(obj) -> bytes:
    """`obj` pickled, with the linted code's str/int/enum subclasses as builtin values (`_PlainPickler`);
    only where the plain ``pickle.dumps`` failed on them (the fallback is slower)."""
    import io

    buf = io.BytesIO()
    _PlainPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _send_msg(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int, deadline: Optional[float]) -> Optional[bytes]:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if not select.select([sock], [], [], left)[0]:
                continue
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv_msg(sock: socket.socket, deadline: Optional[float] = None):
    """The next message; None at EOF; TimeoutError when none started before `deadline`."""
    head = _recv_exact(sock, _HEADER.size, deadline)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    data = _recv_exact(sock, size, None)
    return None if data is None else pickle.loads(data)


def _frames(raw: bytes) -> List[bytes]:
    """The whole frames (8-byte length + body) in `raw`; a cut-off one is dropped."""
    out, pos = [], 0
    while pos + _HEADER.size <= len(raw):
        (size,) = _HEADER.unpack(raw[pos:pos + _HEADER.size])
        body = raw[pos + _HEADER.size:pos + _HEADER.size + size]
        if len(body) != size:
            break
        out.append(body)
        pos += _HEADER.size + size
    return out
