"""The simulated node has no network: a connection the setup code opens fails at once, as on a machine
that is offline, instead of waiting on name resolution or a TCP timeout (a data loader that asks a
remote server for the size of each data file blocked the replay until its deadline).

Name resolution of anything but this machine answers ``socket.gaierror`` (``EAI_NONAME``) and a
connect to an address off this machine answers ``ENETUNREACH``, each naming the host and saying why.
The first such attempt is noted with the project line that made it. Loopback (the simulated process
group's store, ``MASTER_ADDR=127.0.0.1``) works as before."""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import sys
from typing import Any, Callable

Patch = Callable[[Any, str, Any], None]

_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "", None}


def _is_local(host) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host in _LOCAL_NAMES or host == socket.gethostname():
        return True
    try:
        addr = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False
    return addr.is_loopback or addr.is_unspecified


def _asker() -> str:
    """The innermost frame of project code on the stack (what asked for the network)."""
    from fsdp_lint.entry.project import is_local

    f = sys._getframe(2)
    while f is not None:
        fname = f.f_code.co_filename
        if os.path.isabs(fname) and is_local(fname) and "fsdp_lint" not in fname:
            return f"{os.path.relpath(fname)}:{f.f_lineno}"
        f = f.f_back
    return ""


# refusals answered as ordinary errors (a script's own offline fallback works); after them the setup is
# waiting on the network (retries with back-off, one request per data file): NetworkWait ends the statement
REFUSALS_BEFORE_STOP = 3


class NetworkWait(BaseException):
    """The setup keeps asking for the network after it was refused (a BaseException: the retry loops
    of the linted code catch ``Exception``); the message is the one line to report. The replay skips
    the statement it ends, as any statement that needs what the simulated node lacks (a data set
    whose remote files' sizes are read one by one), unless that statement decides the wrap: then the
    replay ends, naming it."""


def install(rec, patch: Patch) -> None:
    real_getaddrinfo, real_connect, real_connect_ex = socket.getaddrinfo, socket.socket.connect, socket.socket.connect_ex
    asked = []       # (host, port, where) of each refused attempt
    waited = [0]     # how many had been refused when the last NetworkWait was raised

    def note(host, port) -> str:
        where = _asker()
        asked.append((host, port, where))
        at = f" at {where}" if where else ""
        if len(asked) - waited[0] > REFUSALS_BEFORE_STOP:
            again = sum(1 for h, _, _ in asked[:-1] if h == host)
            waited[0] = len(asked)      # the next statement gets its own ordinary refusals first
            raise NetworkWait(
                f"the setup code waits on the network: it asks for {host}:{port}{at} ({again} times refused "
                f"before; {len(asked)} requests in all: retries, or one request per remote file); a lint has no "
                f"network -- point the script at local copies of what it reads there (a data set, a checkpoint)")
        notes = rec.__dict__.setdefault("framework_notes", [])
        if len(asked) == 1:
            notes.append(f"the setup asked for the network ({host}:{port}{', at ' + where if where else ''}): "
                         f"a lint has none; the connection failed at once, as on an offline machine")
        return f"fsdp-lint: no network while linting (the setup asked for {host}:{port})"

    def getaddrinfo(host, port, *args, **kwargs):
        if _is_local(host):
            return real_getaddrinfo(host, port, *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, note(host, port))

    def refuse(sock, address):
        host, port = (address[0], address[1]) if isinstance(address, tuple) and len(address) >= 2 else (address, "")
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(host):
            raise OSError(errno.ENETUNREACH, note(host, port))
        return None

    def connect(self, address):
        refuse(self, address)
        return real_connect(self, address)

    def connect_ex(self, address):
        try:
            refuse(self, address)
        except OSError as exc:
            return exc.errno
        return real_connect_ex(self, address)

    patch(socket, "getaddrinfo", getaddrinfo)
    patch(socket.socket, "connect", connect)
    patch(socket.socket, "connect_ex", connect_ex)
