"""Under ``torchrun`` this process is one rank: nothing is spawned, the reports travel through the
launcher's store, rank 0 writes the report and a watchdog ends every rank at the deadline."""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import List, Optional

from fsdp_lint.run.evidence import apply_evidence, run_summary
from fsdp_lint.run.failures import at_frame, describe_exception, one_line
from fsdp_lint.run.launch import describe_timeout
from fsdp_lint.run.session import rank_main
from fsdp_lint.run.spec import PG_TIMEOUT_MARGIN_S, RunError, RunOptions, check_host_memory, spec_for, td


class _StoreReporter:
    def __init__(self, store, prefix: str, rank: int):
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.last_phase = "starting"

    def phase(self, name: str, order: int) -> None:
        self.last_phase = name
        with contextlib.suppress(Exception):
            self.store.set(f"{self.prefix}/phase/{self.rank}", json.dumps([name, order]))

    def result(self, data: dict) -> None:
        self._put("result", data)

    def compare(self, data: dict) -> None:
        self._put("compare", data)

    def done(self) -> None:
        self._put("done", {})

    def crash(self, data: dict) -> None:
        self._put("crash", data)

    def _put(self, kind: str, data: dict) -> None:
        clean = {k: v for k, v in data.items() if not k.startswith("_")}
        with contextlib.suppress(Exception):
            self.store.set(f"{self.prefix}/{kind}/{self.rank}", json.dumps(clean, default=str))


class _Watchdog:
    """torchrun: at the deadline, rank 0 names the late ranks, and every rank exits (code 2)."""

    def __init__(self, deadline: float, timeout: float, rank: int, ws: int, store, prefix_fn):
        self.deadline, self.timeout, self.rank, self.ws = deadline, timeout, rank, ws
        self.store, self.prefix_fn = store, prefix_fn
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fsdp-lint-watchdog", daemon=True)

    def start(self) -> "_Watchdog":
        self.thread.start()
        return self

    def cancel(self) -> None:
        self.stop.set()

    def _run(self) -> None:
        if self.stop.wait(max(0.0, self.deadline - time.monotonic())):
            return
        if self.rank == 0:
            state = [{"phase": "unknown", "order": 0, "done": False, "closed": False} for _ in range(self.ws)]
            prefix = self.prefix_fn()

            def read() -> None:
                for r in range(self.ws):
                    with contextlib.suppress(Exception):
                        if self.store.check([f"{prefix}/phase/{r}"]):
                            state[r]["phase"], state[r]["order"] = json.loads(self.store.get(f"{prefix}/phase/{r}"))
                        state[r]["done"] = self.store.check([f"{prefix}/done/{r}"])

            # the store may be busy with the main thread: read it on the side, a few seconds at most
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            reader.join(timeout=3.0)
            msg = describe_timeout(state, self.timeout)
            with contextlib.suppress(Exception):
                # the file descriptor: sys.stderr may be redirected while the user's code runs
                os.write(2, f"fsdp-lint: error: --run: {msg}\n".encode())
        else:
            time.sleep(2.0)
        os._exit(2)


def confirm_torchrun(runnable, settings, opts: RunOptions, t0: float) -> Optional[dict]:
    import torch
    import torch.distributed as dist

    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_ws = int(os.environ.get("LOCAL_WORLD_SIZE", str(ws)))
    deadline = t0 + opts.timeout
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if opts.device == "cuda" and have <= local_rank:
        raise RunError(f"--device cuda: rank {rank} needs GPU {local_rank}, this node has {have}")
    use_cuda = opts.device == "cuda" or (opts.device == "auto" and have > local_rank and have >= local_ws)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    if not use_cuda:
        check_host_memory(runnable, local_ws)
    if use_cuda:
        torch.cuda.set_device(local_rank)
    created = False
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=td(opts.timeout + PG_TIMEOUT_MARGIN_S))
        created = True
    store = dist.distributed_c10d._get_default_store()
    current = {"prefix": "fsdp_lint/0"}
    dog = _Watchdog(deadline, opts.timeout, rank, ws, store, lambda: current["prefix"]).start()
    remaining = lambda: max(1.0, deadline - time.monotonic())  # noqa: E731
    files = []
    try:
        for i, res in enumerate(runnable):
            prefix = current["prefix"] = f"fsdp_lint/{i}"
            spec = spec_for(res, settings, opts)
            rep = _StoreReporter(store, prefix, rank)
            try:
                rank_main(spec, rank, ws, device, rep, store, prefix, remaining)
            except Exception as exc:  # noqa: BLE001
                rep.crash(describe_exception(exc, rep.last_phase))
                if rank == 0:
                    raise RunError(f"rank 0 failed in phase '{rep.last_phase}': {type(exc).__name__}: "
                                   f"{one_line(str(exc))}") from None
                return None
            rep.done()
            if rank != 0:
                continue
            per_rank = _collect_from_store(store, prefix, ws, remaining)
            files.append(apply_evidence(res, per_rank, spec, ws, opts))
        if rank != 0:
            with contextlib.suppress(Exception):
                store.wait(["fsdp_lint/finished"], td(remaining()))
    finally:
        if rank == 0:
            # rank 0 has read everything (or gave up): release the others
            with contextlib.suppress(Exception):
                store.set("fsdp_lint/finished", "1")
        dog.cancel()
        if created:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    if rank != 0:
        return None
    return run_summary(files, backend, device.type, ws, opts, "torchrun", t0)


def _collect_from_store(store, prefix: str, ws: int, remaining) -> List[dict]:
    out = []
    for r in range(ws):
        key = f"{prefix}/result/{r}"
        crash_key = f"{prefix}/crash/{r}"
        data = None
        end = time.monotonic() + remaining()
        while time.monotonic() < end:
            if store.check([key]):
                data = json.loads(store.get(key))
                break
            if store.check([crash_key]):
                crash = json.loads(store.get(crash_key))
                raise RunError(f"rank {r} failed in phase '{crash.get('phase')}': {crash['type']}: "
                               f"{crash['message']}{at_frame(crash)}")
            time.sleep(0.05)
        if data is None:
            raise RunError(f"rank {r} sent no result")
        if data.get("setup_error"):
            raise RunError(data["setup_error"])
        out.append(data)
    if all(d.get("error") is None for d in out):
        for r, d in enumerate(out):
            ckey = f"{prefix}/compare/{r}"
            dkey = f"{prefix}/done/{r}"
            end = time.monotonic() + remaining()
            while time.monotonic() < end:
                if store.check([ckey]):
                    d["compare"] = json.loads(store.get(ckey))
                    break
                if store.check([dkey]):
                    break
                time.sleep(0.05)
    return out
