"""The fork server: imports torch and the pipeline once, then forks one child per file to lint (see
`fsdp_lint.isolation`)."""
from __future__ import annotations

import collections
import contextlib
import gc
import os
import pickle
import select
import signal
import socket
import sys
import tempfile
from typing import Any, Dict, List, Optional, Set, Tuple

from fsdp_lint.process import reaper
from fsdp_lint.engine import LintError

from fsdp_lint.isolation import _MAX_JOBS, _cpus, stacks
from fsdp_lint.isolation.wire import _HEADER, _frames, _recv_msg, _send_msg, plain_dumps

# the child's way out, bound before any linted code runs (which may replace os._exit, len, ...)
_exit, _getpid, _write, _pack, _dumps = os._exit, os.getpid, os.write, _HEADER.pack, pickle.dumps

# a small model the server lints once at start, so that what torch and fsdp-lint import or build
# lazily on a first replay (FSDP1 and FSDP2 recorders, DTensor's ops, the rules) is in place before
# the first fork (torch._dynamo, behind the meta-device functions, is not imported at all:
# replay.dynamo)
_WARM_UP = '''
import functools
import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy


class Block(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 2)
        self.fc = nn.Linear(dim, dim)
        self.conv = nn.Conv1d(dim, dim, 1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(16, 32)


model = Net()
model.embed.requires_grad_(False)
model = model.to(torch.bfloat16)
{wrap}
optimizer = torch.optim.AdamW(model.parameters())
'''
_WARM_UP_WRAPS = (
    "for block in model.blocks:\n    fully_shard(block)\nfully_shard(model)",
    "model = FSDP(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, "
    "transformer_layer_cls={Block}), use_orig_params=True)",
)


class _Child:
    def __init__(self, job: dict, pid: int, r: int, phases: int, stacks: int = -1):
        self.job, self.pid, self.r = job, pid, r
        self.phases = phases                # where the lint is (engine._phase), a line per change
        self.stacks = stacks                # its threads' stacks, dumped there at a timeout (stacks.py)
        self.pidfd = _pidfd(pid)
        self.chunks: List[bytes] = []
        self.partial = b""


def serve(fd: int, avoid: List[str] = ()) -> None:
    """Body of the fork server: import once, then fork one child per job until fsdp-lint is gone."""
    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # fsdp-lint handles Ctrl-C and tells us
    reaper.prctl(reaper._PR_SET_CHILD_SUBREAPER, 1)
    try:
        _preload()
    except BaseException as exc:  # noqa: BLE001 - reported, then the server ends
        with contextlib.suppress(Exception):
            _send_msg(sock, ("error", f"{type(exc).__name__}: {exc}".splitlines()[0]))
        return
    _send_msg(sock, ("ready", os.getpid()))
    try:
        _Server(sock, set(avoid)).loop()
    finally:
        _kill_descendants()
        os._exit(0)


def _preload() -> None:
    """What every child needs, imported once here (children inherit it at fork)."""
    import torch  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.nn  # noqa: F401

    from fsdp_lint import engine, replay  # noqa: F401
    from fsdp_lint.check import rule, selection  # noqa: F401
    from fsdp_lint.model import tree  # noqa: F401
    from fsdp_lint.plan import build, layout  # noqa: F401
    from fsdp_lint.replay.dynamo import skip_dynamo_import

    skip_dynamo_import()     # before the warm-up: no torch._dynamo import here or in a child
    rule.all_rules()
    # what exists now is never walked by a child's collections nor by its skip_dynamo_import (its
    # gc.get_referrers: ~20 ms over everything torch made); freezing, unlike collecting, is free
    gc.freeze()


def _warm_up_all() -> None:
    """The warm-up lints, once the jobs sent with the start are forked (issue 17: a lint of one file
    does not wait ~0.5 s for a warm-up only later children profit from; its child warms up itself)."""
    for wrap in _WARM_UP_WRAPS:
        _warm_up(_WARM_UP.format(wrap=wrap))
    # children never walk (and so never copy) the objects that exist now when they collect garbage
    gc.collect()
    gc.freeze()


def _warm_up(source: str) -> None:
    from fsdp_lint import engine
    from fsdp_lint.config import Settings
    from fsdp_lint.entry.source import parse_source

    with contextlib.suppress(Exception):
        engine.lint_facts(engine.Screened(parse_source("<fsdp-lint warm-up>", source)),
                          Settings(world_size=4, replay_timeout=None))


class _Server:
    def __init__(self, sock: socket.socket, avoid: Set[str]):
        self.sock = sock
        self.parent = _pidfd(os.getppid())   # fsdp-lint's end, also when processes it forked keep the socket
        self.pending: "collections.deque[dict]" = collections.deque()
        self.running: Dict[int, _Child] = {}
        self.slots = max(1, min(_MAX_JOBS, _cpus()))
        self.avoid = avoid                  # libraries not to import here
        self.learned: Set[str] = set()      # libraries imported here
        self.to_learn: Set[str] = set()
        self.retired = False
        self.warmed = False
        # whether files that are not sent yet follow the ones sent: only those profit from a warm-up
        # (a lint of one file would wait for it at exit)
        self.more_expected = False

    def loop(self) -> None:
        while True:
            self._start_pending()
            if not self.warmed and self.more_expected:
                if not self._warm_up_after_first_jobs():
                    return
                continue
            watch: List[Any] = [self.sock] + ([self.parent] if self.parent is not None else [])
            for child in self.running.values():
                watch += [child.r] if child.r >= 0 else []
                watch += [child.phases] if child.phases >= 0 else []
                watch += [child.pidfd] if child.pidfd is not None else []
            polling = any(c.pidfd is None for c in self.running.values())
            ready = select.select(watch, [], [], 0.05 if polling else None)[0]
            if self.parent is not None and self.parent in ready:
                return
            if self.sock in ready:
                msg = _recv_msg(self.sock)
                if msg is None:
                    return
                self._handle(msg)
            for child in list(self.running.values()):
                if child.phases >= 0 and child.phases in ready:
                    self._forward_phases(child)
                if child.r >= 0 and child.r in ready:
                    data = os.read(child.r, 1 << 20)
                    if data:
                        child.chunks.append(data)
                    else:
                        os.close(child.r)
                        child.r = -1
                if (child.pidfd is None or child.pidfd in ready) and _exited(child.pid):
                    self._finish(child)
            if not self.running and not self.pending:
                _kill_descendants()         # what was reparented here once no job can own it

    def _warm_up_after_first_jobs(self) -> bool:
        """Fork the jobs fsdp-lint has sent so far (they wait in the socket), then warm up for the
        files that follow. False: fsdp-lint is gone."""
        while select.select([self.sock], [], [], 0)[0]:
            msg = _recv_msg(self.sock)
            if msg is None:
                return False
            self._handle(msg)
        self._start_pending()
        self.warmed = True
        _warm_up_all()
        return True

    def _handle(self, msg) -> None:
        if msg[0] == "lint":
            self.pending.append(msg[1])
            self.more_expected = not msg[1].get("last", False)
        elif msg[0] == "kill":
            for child in self.running.values():
                if child.job["id"] == msg[1]:
                    if child.stacks >= 0:          # where the file's code was, before it goes
                        with contextlib.suppress(Exception):
                            _send_msg(self.sock, ("stacks", msg[1], stacks.read_dump(child.pid, child.stacks)))
                    _kill_group(child.pid)
            for job in [j for j in self.pending if j["id"] == msg[1]]:
                self.pending.remove(job)
                _send_msg(self.sock, ("done", job["id"], None, b""))

    def _start_pending(self) -> None:
        while self.pending and len(self.running) < self.slots:
            if self.to_learn and not self.retired:
                self._learn()
            job = self.pending.popleft()
            if self.retired:
                _send_msg(self.sock, ("requeue", job["id"], sorted(self.learned)))
                continue
            r, w = os.pipe()
            phases_r, phases_w = os.pipe()
            stack_fd, stack_path = tempfile.mkstemp(prefix="fsdp-lint-stacks-")   # where it was, at a timeout
            os.unlink(stack_path)
            pid = os.fork()
            if pid == 0:                            # the child
                os.close(r)
                os.close(phases_r)
                stacks.register(stack_fd)
                for fd in [self.sock.fileno(), self.parent] + [c.r for c in self.running.values()] + \
                        [c.phases for c in self.running.values()] + [c.pidfd for c in self.running.values()] + \
                        [c.stacks for c in self.running.values()]:
                    with contextlib.suppress(Exception):
                        if fd is not None and fd >= 0:
                            os.close(fd)
                _child(job, w, phases_w)            # never returns
            os.close(w)
            os.close(phases_w)
            with contextlib.suppress(OSError):
                os.setpgid(pid, pid)                # as the child does: no window without its own group
            self.running[pid] = _Child(job, pid, r, phases_r, stack_fd)
            _send_msg(self.sock, ("started", job["id"], pid))

    def _forward_phases(self, child: _Child, final: bool = False) -> None:
        """The child's phase lines (``name key=value ...``), to fsdp-lint: each changes the deadline.
        `final`: the child has ended; what is left, without waiting for a writer a grandchild holds."""
        if final:
            os.set_blocking(child.phases, False)
        while child.phases >= 0:
            try:
                data = os.read(child.phases, 1 << 16)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data:
                *lines, child.partial = (child.partial + data).split(b"\n")
                for line in lines:
                    phase = _parse_phase(line)
                    if phase is not None:
                        _send_msg(self.sock, ("phase", child.job["id"], phase[0], phase[1]))
            if not data or not final:
                if data == b"" or final:
                    os.close(child.phases)
                    child.phases = -1
                return

    def _finish(self, child: _Child) -> None:
        # the group is killed while the child is a zombie: its number cannot be reused yet
        _kill_group(child.pid)
        status = os.waitpid(child.pid, 0)[1]
        if child.phases >= 0:
            self._forward_phases(child, final=True)
        if child.r >= 0:
            child.chunks += _drain(child.r)
            os.close(child.r)
        if child.pidfd is not None:
            os.close(child.pidfd)
        if child.stacks >= 0:
            os.close(child.stacks)
        del self.running[child.pid]
        frames = _frames(b"".join(child.chunks))
        if len(frames) > 1:
            with contextlib.suppress(Exception):
                self.to_learn |= set(pickle.loads(frames[1])) - self.learned - self.avoid
        _send_msg(self.sock, ("done", child.job["id"], status, frames[0] if frames else b""))

    def _learn(self) -> None:
        """Import the libraries children imported, as a replay would (same simulated world)."""
        import threading

        names = sorted(self.to_learn, key=lambda n: (n.count("."), n))
        self.to_learn.clear()
        self.learned |= set(names)
        source = "".join(f"import {n}\n" for n in names) + _WARM_UP.format(wrap="fully_shard(model)")
        _warm_up(source)
        if threading.active_count() > 1:
            # forking a process with more than one thread is not safe: a new server takes over
            self.retired = True



def _drain(fd: int) -> List[bytes]:
    """What is left in the result pipe, without waiting for a writer that a grandchild may hold."""
    os.set_blocking(fd, False)
    out = []
    with contextlib.suppress(BlockingIOError, OSError):
        while True:
            data = os.read(fd, 1 << 20)
            if not data:
                break
            out.append(data)
    return out


_PHASES = ("setup", "forward", "analysis")


def _parse_phase(line: bytes):
    """``b"analysis modules=3 depth=2"`` -> ("analysis", {"modules": 3, "depth": 2}); None if garbled
    (the file's code can write to any descriptor)."""
    words = line.decode("ascii", "replace").split()
    if not words or words[0] not in _PHASES or len(words) > 8:
        return None
    info = {}
    for word in words[1:]:
        key, _, value = word.partition("=")
        if key not in ("modules", "depth", "units") or not value.isdigit() or len(value) > 12:
            return None
        info[key] = int(value)
    return words[0], info


def _pidfd(pid: int) -> Optional[int]:
    with contextlib.suppress(Exception):
        return os.pidfd_open(pid)
    return None


def _kill_group(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def _exited(pid: int) -> bool:
    """Whether the child has ended (it is not reaped: its pid and group stay reserved)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None and info.si_pid == pid


def _kill_descendants() -> int:
    """Kill every process below this (subreaper) server but the running jobs' children, with their
    process groups; reap them. Returns how many processes were killed."""
    killed = 0
    for _ in range(100):
        left = reaper.children(os.getpid())
        if not left:
            break
        reaper.kill_processes(left, spare_groups={os.getpgid(0)})
        killed += len(left)
        for pid in left:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)
    # zombies of processes that were reparented here and had already exited
    with contextlib.suppress(ChildProcessError, OSError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    return killed


# ============================================================================================
# the child
# ============================================================================================
def _child(job: dict, w: int, phases: int) -> None:
    me = _getpid()
    code = 0
    try:
        from fsdp_lint import engine

        def tell(name: str, info: dict) -> None:
            # one short line (atomic in a pipe); never fails the lint
            line = " ".join([name] + [f"{k}={int(v)}" for k, v in info.items()]) + "\n"
            with contextlib.suppress(Exception):
                if _getpid() == me:
                    _write(phases, line.encode())

        engine._phase_listener = tell
        os.setpgid(0, 0)
        reaper.prctl(reaper._PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        # torch's module walks recurse once per level: a 1,000-deep model needs more than Python's
        # default (its own script raises it to build the model; the analysis must not need less)
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
        # a lint builds many objects that live until it ends (the model, the tree, the layout):
        # collecting every 700 allocations walks them again and again (a third of the lint of
        # 10,000 units); cyclic garbage is still collected, less often
        gc.set_threshold(100_000, 50, 100)
        before = set(sys.modules)
        out = _lint_in_child(job)
        gc.disable()       # a large result (10,000 units) pickles 3x faster without collections
        try:
            data = _dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - a value of the project's own type (a StrEnum mesh dim name)
            try:
                data = plain_dumps(out)
            except Exception as exc:  # noqa: BLE001
                data = _dumps(("internal", type(exc).__name__, f"cannot send the result: {exc}", ""))
        try:
            libraries = _dumps(_new_libraries(before))
        except Exception:  # noqa: BLE001 - only an optimisation
            libraries = _dumps([])
        if _getpid() == me:                          # not a fork the file's code made of this process
            view = memoryview(_pack(data.__len__()) + data + _pack(libraries.__len__()) + libraries)
            while view:
                view = view[_write(w, view):]
    except BaseException:  # noqa: BLE001
        code = 70
    finally:
        _exit(code)                                  # no atexit hooks, no waiting for the file's threads


def _new_libraries(before: Set[str]) -> List[str]:
    """Modules of installed libraries imported since the fork (not the repository's own code)."""
    from fsdp_lint.entry.project import is_local

    out = []
    for name, mod in list(sys.modules.items()):
        if name in before or name.startswith(("__", "fsdp_lint")):
            continue
        fname = getattr(mod, "__file__", None)
        if not isinstance(fname, str) or fname.startswith("<"):
            continue
        norm = fname.replace("\\", "/")
        if (not is_local(fname)) if fname.endswith(".py") else ("-packages/" in norm or "/lib/python3" in norm):
            out.append(name)
    return out[:5000]


def _lint_in_child(job: dict) -> Tuple:
    import dataclasses
    import traceback

    from fsdp_lint import engine

    screened, settings, name = job["screened"], job["settings"], job["name"]
    try:
        os.chdir(job["process_cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        sys.path[:] = job["sys_path"]
        # the deadline is kept from outside (fsdp-lint kills this process group), not by SIGALRM,
        # which the file's code could ignore or use itself
        settings = dataclasses.replace(settings, replay_timeout=None)
        if job["call"]:
            import importlib

            module, _, func = job["call"].partition(":")
            return ("ok", getattr(importlib.import_module(module), func)(settings))
        return ("ok", engine.lint_facts(screened, settings, argv=job["argv"], explicit=job["explicit"],
                                        cwd=job["cwd"]))
    except LintError as exc:
        user = getattr(exc, "user_exception", None)
        text = "".join(traceback.format_exception(type(user), user, user.__traceback__)) if user is not None else ""
        return ("lint_error", str(exc), text)
    except SystemExit as exc:
        return ("lint_error", f"{name}: the file's code called sys.exit({exc.code!r}) while it was linted", "")
    except KeyboardInterrupt:
        return ("lint_error", f"{name}: interrupted", "")
    except BaseException as exc:  # noqa: BLE001 - a bug: the parent says so in one line
        text = str(exc).strip()
        return ("internal", type(exc).__name__, text.splitlines()[0] if text else "", traceback.format_exc())
