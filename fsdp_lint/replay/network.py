"""The simulated node has no network: a connection the setup code opens fails at once, as on a machine
that is offline, instead of waiting on name resolution or a TCP timeout (a data loader that asks a
remote server for the size of each data file blocked the replay until its deadline).

Name resolution of anything but this machine answers ``socket.gaierror`` (``EAI_NONAME``) and a
connect to an address off this machine answers ``ENETUNREACH``, each naming the host and saying why.
The first such attempt is noted with the project line that made it. Loopback (the simulated process
group's store, ``MASTER_ADDR=127.0.0.1``) works as before; a loopback port nothing listens on (a controller
the job's launcher starts beside its workers) is refused as a node without that service would refuse it,
and retries with back-off end after the same few refusals, naming the service."""
from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import sys
from typing import Any, Callable, Optional

from fsdp_lint.replay.hub_commands import SETUP_FILES, download_command

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


def _is_address(host) -> bool:
    try:
        ipaddress.ip_address(str(host).split("%")[0])
        return True
    except ValueError:
        return False


def _asker(depth: int = 2) -> str:
    """``path:line`` of the innermost frame of project code on the stack from `depth` frames up (what asked
    for the network, what started a process)."""
    from fsdp_lint.entry.project import is_local

    f = sys._getframe(depth)
    while f is not None:
        fname = f.f_code.co_filename
        if os.path.isabs(fname) and is_local(fname) and "fsdp_lint" not in fname:
            return f"{os.path.relpath(fname)}:{f.f_lineno}"
        f = f.f_back
    return ""


# refusals answered as ordinary errors (a script's own offline fallback works); after them the setup is
# waiting on the network (retries with back-off, one request per data file): NetworkWait ends the statement
REFUSALS_BEFORE_STOP = 3


class NotDownloaded(OSError):
    """What a GPU node downloads at setup (a hub model's config, its tokenizer) is not here, and fsdp-lint
    never downloads: skipped as a missing file is, unless the statement decides the wrap (a tokenizer
    whose length sizes the embeddings), which ends the replay naming it."""


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

    def note(host, port, local: bool = False) -> str:
        where = _asker()
        asked.append((host, port, where))
        at = f" at {where}" if where else ""
        if len(asked) - waited[0] > REFUSALS_BEFORE_STOP:
            again = sum(1 for h, _, _ in asked[:-1] if h == host)
            waited[0] = len(asked)      # the next statement gets its own ordinary refusals first
            if local:
                raise NetworkWait(
                    f"the setup code waits on a service of this node: it asks for {host}:{port}{at} ({again} times "
                    f"refused before): nothing listens there in a lint -- a service the job's launcher starts beside "
                    f"the workers (a controller, a parameter server) is not running; lint the launch the workers get "
                    f"their settings from, or give them as arguments")
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
        if sock.type == socket.SOCK_DGRAM and _is_address(host):
            return None     # a UDP connect sends nothing: the node's own address probe (`connect(("8.8.8.8", 80))`)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(host):
            raise OSError(errno.ENETUNREACH, note(host, port))
        return None

    def connect(self, address):
        refuse(self, address)
        try:
            return real_connect(self, address)
        except ConnectionRefusedError:
            # nothing listens on this machine's port: a service the node's launcher would have started;
            # retrying with back-off would wait until the replay's deadline
            if self.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
                note(address[0], address[1], local=True)
            raise

    def connect_ex(self, address):
        try:
            refuse(self, address)
        except OSError as exc:
            return exc.errno
        code = real_connect_ex(self, address)
        if code == errno.ECONNREFUSED and self.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
            note(address[0], address[1], local=True)
        return code

    patch(socket, "getaddrinfo", getaddrinfo)
    patch(socket.socket, "connect", connect)
    patch(socket.socket, "connect_ex", connect_ex)
    _remove_failed_downloads(rec, patch, asked)


_CREATED: list = []       # [the files the running replay created]
_REMOVED: list = []       # those removed so far (named in a note at the end)


def remove_failed_downloads() -> list:
    """Remove the files the replay created that are still empty (a download refused after its file was
    opened): at once when a statement is skipped for the network -- the statements after it find no
    file, as on a node whose download failed before it wrote one, instead of an empty data set -- and
    when the replay ends. Returns every file removed so far (relative paths)."""
    for path in dict.fromkeys(_CREATED[0] if _CREATED else ()):
        try:
            if os.path.isfile(path) and os.path.getsize(path) == 0:
                os.unlink(path)
                _REMOVED.append(path)
        except OSError:
            pass
    return [os.path.relpath(p) for p in dict.fromkeys(_REMOVED)]


def removed_download(exc: BaseException) -> bool:
    """`exc` is the missing file of a download this replay removed (refused, it was left empty)."""
    name = getattr(exc, "filename", None)
    return isinstance(exc, FileNotFoundError) and isinstance(name, (str, bytes, os.PathLike)) and \
        os.path.abspath(os.fsdecode(name)) in _REMOVED


def _remove_failed_downloads(rec, patch: Patch, asked: list) -> None:
    """A download opens its file, then asks the network (``with open(path, "w") as f: f.write(get(url))``):
    refused, it leaves the file empty, and the next lint reads an empty data set where the first said the
    network was missing. The files the replay created are noted; when the network was refused, those
    still empty at its end are removed (and named), as they were before it."""
    import builtins
    import io

    real_open = builtins.open
    created: list = []
    _CREATED[:] = [created]         # what a statement skipped for the network removes (remove_failed_downloads)
    _REMOVED.clear()

    def tracking_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and isinstance(mode, str) and any(c in mode for c in "wax+"):
            path = os.path.abspath(os.fsdecode(file))
            if not os.path.exists(path):
                created.append(path)
        return real_open(file, mode, *args, **kwargs)

    def remove() -> None:
        removed = remove_failed_downloads() if asked else []
        _CREATED.clear()
        if removed:
            rec.__dict__.setdefault("framework_notes", []).append(
                f"removed the empty file{'s' if len(removed) > 1 else ''} the setup created before its download "
                f"was refused (no network): {', '.join(removed[:3])}{' ...' if len(removed) > 3 else ''}")

    patch(builtins, "open", tracking_open)
    patch(io, "open", tracking_open)
    rec.__dict__.setdefault("after_replay", []).append(remove)


# -- what a failure says about the network --------------------------------------------------
_NO_NETWORK = re.compile(r"fsdp-lint: no network while linting \(the setup asked for ([^)\s]+)\)")


def network_ask(exc: BaseException) -> Optional[str]:
    """``host:port`` when `exc` comes from a connection the simulated node refused (the refusal may be
    several exceptions down: requests' ConnectionError over urllib3's MaxRetryError over ours)."""
    todo, seen = [exc], 0
    while todo and seen < 16:
        e = todo.pop()
        seen += 1
        found = _NO_NETWORK.search(str(e))
        if found:
            return found.group(1)
        todo += [x for x in (e.__cause__, e.__context__, getattr(e, "reason", None), *getattr(e, "args", ()))
                 if isinstance(x, BaseException)]
    return None


def network_text(exc: BaseException) -> str:
    return (f"the setup reads over the network ({type(exc).__name__} asking for {network_ask(exc)}), which a lint "
            f"does not have, and the model or its wrap depends on what it reads: point the script at a local copy "
            f"(a data set, a tokenizer, a config), or run it once where it can download")


# on a hub error an installed library's `hf_hub_download` raised (frameworks.hf._hub_file): the file it asked for
HUB_FILE = "_fsdp_lint_hub_file"


def download_hint(msg: str, exc: Optional[BaseException] = None) -> str:
    """fsdp-lint never downloads: the hub file a library asked for (named, with the command that gets it),
    else a hub model's config, else nothing."""
    if "fsdp-lint never downloads" in msg or "fsdp-lint does not download" in msg or "not a hub model" in msg:
        return ""           # fsdp-lint's own text says it already (or that the name is a folder)
    seen = 0
    while exc is not None and seen < 8:
        asked = getattr(exc, HUB_FILE, None)
        if asked:
            repo, name, kind, revision = (*asked, None)[:4]
            if str(repo).startswith(("/", ".", "~")):
                return ""       # a local folder the node has (or a recipe's placeholder): no hub repository
            rev = f" --revision {revision}" if revision and revision != "main" else ""
            if not name:    # snapshot_download of a model: its configs are what a lint reads
                return (f" (the hub repository {repo}{f' at revision {revision}' if rev else ''} is not here, and "
                        f"fsdp-lint never downloads: `{download_command(repo, include=SETUP_FILES, repo_type=kind, revision=revision)}` "
                        f"puts its configs and tokenizer (no weights) in the local Hugging Face cache, as "
                        f"--fetch-configs does)")
            return (f" ({name} of the hub repository {repo} is not here, and fsdp-lint never downloads: "
                    f"`{download_command(repo, [name], repo_type=kind, revision=revision)}` puts it in "
                    f"the local Hugging Face cache)")
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    # (a file read from the empty folder a hub data set's snapshot_download stood in as: frameworks.hf)
    dataset = re.search(r"/api/datasets/([\w.-]+/[\w.-]+)", msg) or \
        re.search(r"huggingface\.co/datasets/([\w.-]+/[\w.-]+)", msg) or \
        re.search(r"fsdp-lint-hub-datasets/([\w.-]+/[\w.-]+)/", msg)
    if dataset:         # a data set of the hub (`load_dataset`, LeRobotDataset's `repo_id`), not a model
        return (f" (the hub data set {dataset.group(1)} is not here, and fsdp-lint never downloads: "
                f"`{download_command(dataset.group(1), repo_type='dataset')}` puts it in the local Hugging Face "
                f"cache, or point the script at a local copy)")
    if any(w in msg for w in ("huggingface.co", "from_pretrained", "cached files", "offline mode", "HF Hub",
                              "outgoing traffic has been disabled")):
        return (" (fsdp-lint does not download models or configs: have the model's config.json in the local "
                "Hugging Face cache (HF_HOME), or build the model from a config in the linted code, e.g. "
                "AutoModelForCausalLM.from_config(AutoConfig.for_model(...)))")
    return ""
