"""The pipe between fsdp-lint and its fork server: 8-byte length + pickle."""
from __future__ import annotations

import pickle
import select
import socket
import struct
import time
from typing import List, Optional

_HEADER = struct.Struct("!Q")

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
