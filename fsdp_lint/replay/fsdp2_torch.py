"""What the installed torch's FSDP2 does where its versions differ, read once from that torch's own
source (``benchmarks/torch_versions.sh`` runs the oracle tests on each version):

* which parameters of a group must share one original dtype at the first forward
  (``FSDPParamGroup._init_mp_dtypes``): every parameter, frozen ones too (torch 2.6, 2.7: a frozen
  bf16 base weight beside fp32 adapters fails there), or the trainable ones only (2.8 and later);
* whether the root group reshards after forward when ``reshard_after_forward=True`` was given
  explicitly (``FSDPState._lazy_init``): 2.8 and later keep the explicit setting; 2.6 and 2.7 never
  reshard the root;
* whether a group on a 1-rank mesh issues its all-gather (``FSDPParamGroup.unshard``) and its
  gradient reduce-scatter (``foreach_reduce``), 0 bytes to other ranks: 2.6-2.8 issue both, 2.9
  the reduce-scatter only, 2.12 and later neither (read on 2.6.0, 2.7.1, 2.8.0, 2.9.1, 2.12.1,
  2.13.0, 2.14.1).

Without a readable source (a frozen application) the newest torch's behaviour is assumed.
"""
from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=None)
def _source(what: str) -> str:
    import inspect

    try:
        if what == "_lazy_init":
            from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState as obj

            obj = obj._lazy_init
        elif what == "foreach_reduce":
            from torch.distributed.fsdp._fully_shard._fsdp_collectives import foreach_reduce as obj
        else:
            from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

            obj = getattr(FSDPParamGroup, what)
        return inspect.getsource(obj)
    except Exception:   # noqa: BLE001 - no source: the newest torch's behaviour
        return ""


def uniform_dtype_includes_frozen() -> bool:
    """True where FSDP2 asserts one original dtype over all of a group's parameters, frozen ones
    included (torch 2.6); False where over the trainable ones only."""
    text = _source("_init_mp_dtypes")
    return bool(text) and "requires_grad" not in text


def one_rank_all_gather() -> bool:
    """True where a group on a 1-rank mesh still issues its all-gather."""
    text = _source("unshard")
    return bool(text) and not re.search(r"world_size\s*==\s*1", text)


def one_rank_reduce_scatter() -> bool:
    """True where a group on a 1-rank mesh still issues its gradient reduce-scatter."""
    text = _source("foreach_reduce")
    return bool(text) and not re.search(r"if\s+world_size\s*>\s*1\s*:\s*\n\s*reduce_scatter_comm\(", text)


def root_reshards_when_explicit() -> bool:
    """True where the root group keeps an explicit ``reshard_after_forward=True`` (its lazy init
    clears the root's post-forward resharding only when it was left at its default)."""
    text = _source("_lazy_init")
    return not text or "_auto_reshard_after_forward" in text
