"""Data sets that cannot be loaded here stand in as real, tiny ``datasets`` objects.

A lint never downloads (``HF_DATASETS_OFFLINE=1``) and the data files of a training job are rarely in
the repository, so ``datasets.load_dataset(...)`` / ``load_from_disk(...)`` fail during a replay. The
script then builds its data with the library's own functions -- ``select_columns``, ``shuffle``,
``select(range(len(ds)))``, ``concatenate_datasets``, ``train_test_split``, ``map``, ``filter``,
``DatasetDict`` -- and hands it to a Trainer that asks for its length. The stand-in is what the library
returns, so all of that works as it does on the node:

* ``split=...`` given: a ``datasets.Dataset`` of `ROWS` placeholder rows (``streaming=True``: an
  ``IterableDataset``); no split: a ``DatasetDict`` with the splits of ``data_files`` (or ``train``),
  in which any other split the script asks for exists (``if "validation" in raw: ...``);
* its columns are ``features``' when the call gives them, else ``text``; a column the script asks for
  (``ds["messages"]``, ``select_columns``, ``remove_columns``, ``rename_column``, a ``map``/``filter``
  function reading ``example["prompt"]``) is added, with the placeholder text, where it is asked for --
  a chat column (``messages``, ``conversations``, ``chosen``/``rejected``, `CHAT_COLUMNS`) with a
  user/assistant exchange of ``{"role", "content"}`` messages, as chat data sets and TRL hold them (each turn
  also in ShareGPT's ``from``/``value``);
  a data set derived from a stand-in (mapped, shuffled, concatenated, split) keeps these answers;
* ``select(indices)`` past its rows takes them modulo its length (``select(range(args.max_samples))``);
* ``save_to_disk`` of a stand-in writes nothing (a prepared-data cache the real job would load later
  must never hold placeholder rows), said in a note;
* a ``map``/``filter`` function that fails on the placeholder rows (its tokenizer is not here either)
  leaves the stand-in as it was, listed as a skipped statement; it runs in this process (``num_proc``
  dropped), so that what fails in it is seen by the replay;

The data never changes a plan, and no batch is ever drawn.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Any, Dict, List, Optional

# the marker a stand-in's DatasetInfo carries: map/shuffle/select/concatenate/split keep it
MARK = "fsdp-lint: a stand-in for a data set that cannot be loaded here"
ROWS = 16
# a document's length (about 1,000 words): text that a pipeline concatenates and cuts into blocks of 1,024 to
# 8,192 tokens gives blocks, as a node's data set does (a one-line placeholder gave none: `num_samples=0`)
TEXT = " ".join(["a placeholder sample: the data set cannot be loaded here."] * 100)
_RETRIES = 16


# the arrow tables of stand-ins (id -> weak reference): a ``Dataset`` built on one (a subclass whose
# ``__init__`` passes ``super().__init__(mapped.data)``) gets a fresh DatasetInfo, and is a stand-in still
_TABLES: Dict[int, Any] = {}


def _remember(ds) -> None:
    table = getattr(ds, "_data", None)
    if table is not None:
        try:
            _TABLES[id(table)] = weakref.ref(table)
        except TypeError:       # pragma: no cover - datasets' tables take weak references
            pass


def _of_standin(table) -> bool:
    ref = _TABLES.get(id(table))
    return ref is not None and ref() is table


# the project's data sets whose length stood in (their data is not here: `Failures.standin_length`)
_LENGTH_STOOD_IN = weakref.WeakSet()


def length_stood_in(ds) -> None:
    try:
        _LENGTH_STOOD_IN.add(ds)
    except TypeError:       # an object without weak references
        pass


def length_was_stood_in(ds) -> bool:
    try:
        return ds in _LENGTH_STOOD_IN
    except TypeError:
        return False


def is_standin(ds) -> bool:
    info = getattr(ds, "_info", None)
    if getattr(info, "description", None) == MARK:
        _remember(ds)
        return True
    return False


def holds_standin(ds) -> bool:
    """`ds` is a stand-in, or a data set of the project's built on one (``self.dataframe = load_dataset(...)``,
    a ``Subset``'s ``dataset``), or one whose length stood in."""
    if is_standin(ds) or length_was_stood_in(ds):
        return True
    own = getattr(ds, "__dict__", None)
    return isinstance(own, dict) and any(is_standin(v) or length_was_stood_in(v) for v in list(own.values()))


def install_loader_length(patch) -> None:
    """A loader over a stood-in data set has a batch: a node's data set has at least a batch of rows, where
    the stand-in's `ROWS` may be fewer than the batch (``drop_last=True`` then gives 0 batches and the project's
    ``assert len(loader) >= 1`` stops a run that goes on on the node)."""
    from torch.utils.data import DataLoader

    real_len = DataLoader.__len__

    def __len__(self):
        length = real_len(self)
        return 1 if length == 0 and holds_standin(getattr(self, "dataset", None)) else length
    patch(DataLoader, "__len__", __len__)


def _value_for(feature) -> Any:
    """A placeholder value of a ``datasets`` feature type."""
    from datasets import ClassLabel, Sequence, Value

    if isinstance(feature, dict):
        return {k: _value_for(v) for k, v in feature.items()}
    if isinstance(feature, (list, Sequence)) or type(feature).__name__ in ("List", "LargeList"):
        return []
    if isinstance(feature, ClassLabel):
        return 0
    if isinstance(feature, Value):
        dtype = str(feature.dtype)
        if dtype == "string" or dtype == "large_string":
            return TEXT
        if dtype == "bool":
            return False
        if "int" in dtype:
            return 0
        if "float" in dtype or "double" in dtype:
            return 0.0
    return None


# the keys an earlier attempt of this replay read from stand-in rows (`fsdp_lint.replay.asked_keys`)
ASKED: Dict[str, None] = {}


def standin_dataset(features=None):
    """`ROWS` placeholder rows: the columns of `features`, else ``text`` and the keys asked (`ASKED`)."""
    from datasets import Dataset, DatasetInfo

    if features:
        data = {name: [_value_for(f)] * ROWS for name, f in features.items()}
        return Dataset.from_dict(data, features=features, info=DatasetInfo(description=MARK, features=features))
    data = {"text": [TEXT] * ROWS}
    data.update({name: [placeholder(name)] * ROWS for name in ASKED if name != "text"})
    return Dataset.from_dict(data, info=DatasetInfo(description=MARK))


def _splits_class():
    from datasets import DatasetDict

    class StandInSplits(DatasetDict):
        """A DatasetDict in which every split the script asks for exists (made when asked for)."""

        def __getitem__(self, key):
            if isinstance(key, str) and not dict.__contains__(self, key):
                dict.__setitem__(self, key, standin_dataset(self._fsdp_lint_features))
            return super().__getitem__(key)

        def __contains__(self, key):
            return isinstance(key, str) or dict.__contains__(self, key)

    return StandInSplits


def standin_for(load, args, kwargs):
    """What ``load_dataset(*args, **kwargs)`` (or ``load_from_disk``) returns, as a stand-in."""
    try:
        bound = inspect.signature(load).bind_partial(*args, **kwargs).arguments
    except TypeError:
        bound = dict(kwargs)
    features = bound.get("features")
    streaming = bool(bound.get("streaming"))
    split = bound.get("split")
    if split is not None:
        if isinstance(split, (list, tuple)):
            return [_maybe_streamed(standin_dataset(features), streaming) for _ in split]
        return _maybe_streamed(standin_dataset(features), streaming)
    files = bound.get("data_files")
    names: List[str] = list(files) if isinstance(files, dict) else ["train"]
    if streaming:
        from datasets import IterableDatasetDict

        return IterableDatasetDict({n: standin_dataset(features).to_iterable_dataset() for n in names})
    splits = _splits_class()({n: standin_dataset(features) for n in names})
    splits._fsdp_lint_features = features
    return splits


def _maybe_streamed(ds, streaming: bool):
    return ds.to_iterable_dataset() if streaming else ds


# --------------------------------------------------------------------------------------------
# columns where they are asked for
# --------------------------------------------------------------------------------------------
# columns that hold a conversation in the chat formats libraries read (TRL's conversational data sets,
# the hub's chat corpora): a list of messages, each a dict with a role and content, and the same turn in
# ShareGPT's keys (`from`: human/gpt, `value`), which many corpora's `conversations` hold
CHAT_COLUMNS = frozenset({"messages", "conversations", "conversation", "chosen", "rejected", "dialog", "dialogue"})


def placeholder(name: str) -> Any:
    """The value of a column the script asks for, by its name: a user/assistant exchange for a chat
    column (TRL's `is_conversational` reads it as one; a ShareGPT reader finds `from`/`value`), else the
    placeholder text."""
    if name in CHAT_COLUMNS:
        return [{"role": "user", "content": TEXT, "from": "human", "value": TEXT},
                {"role": "assistant", "content": TEXT, "from": "gpt", "value": TEXT}]
    return TEXT


def _with_columns(ds, names) -> Any:
    if isinstance(names, str):
        names = [names]
    for name in names or ():
        if isinstance(name, str) and name not in ds.column_names:
            ds = ds.add_column(name, [placeholder(name)] * len(ds))
            ds._info.description = MARK
    return ds


# the folders this replay's `save_to_disk` wrote (rank 0's: ``temp/rank_0``), for the other ranks' (`saved_by_rank_0`)
_SAVED: List[str] = []


def saved_by_rank_0(path) -> Optional[str]:
    """The folder rank 0 saved in place of `path`, one another rank saves before a barrier (``temp/rank_3``):
    the same path but for its numbers. A node's rank 0 then loads every rank's folder; every rank is taken to
    hold rank 0's data, as for the collectives (`fsdp_lint.replay.host_values`)."""
    import os
    import re

    try:
        wanted = re.sub(r"\d+", "#", os.path.abspath(os.fspath(path)))
    except TypeError:
        return None
    return next((p for p in reversed(_SAVED) if re.sub(r"\d+", "#", p) == wanted and os.path.exists(p)), None)


def _not_saved(real, note):
    def save_to_disk(self, dataset_path, *args, **kwargs):
        parts = self.values() if isinstance(self, dict) else [self]
        if not any(is_standin(ds) for ds in parts):
            import os

            out = real(self, dataset_path, *args, **kwargs)
            _SAVED.append(os.path.abspath(os.fspath(dataset_path)))
            return out
        if note is not None:
            note(f"save_to_disk({str(dataset_path)!r}) of a stand-in data set: nothing written (a lint "
                 f"never leaves placeholder rows where the real job would load them)")
        return None
    save_to_disk.__wrapped__ = real
    return save_to_disk


def _missing_column(exc: BaseException, ds) -> Optional[str]:
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str) and exc.args[0] not in ds.column_names:
        return exc.args[0]
    return None


def install_columns_on_demand(patch, datasets_module, on_failure=None, note=None) -> None:
    """Patch ``datasets.Dataset`` for the replay: on a stand-in, a column the script asks for exists, and a
    ``map``/``filter`` whose function fails on the placeholder rows leaves the stand-in as it was
    (`on_failure(exc)` is told); a stand-in is never saved to disk (`note(text)` is told)."""
    Dataset = datasets_module.Dataset
    real_init = Dataset.__init__
    _SAVED.clear()

    def __init__(self, arrow_table, *args, **kwargs):
        real_init(self, arrow_table, *args, **kwargs)
        if _of_standin(arrow_table):
            self._info.description = MARK

    patch(Dataset, "__init__", __init__)
    for owner in (Dataset, getattr(datasets_module, "DatasetDict", None)):
        if owner is not None and hasattr(owner, "save_to_disk"):
            patch(owner, "save_to_disk", _not_saved(owner.save_to_disk, note))

    def wrap_columns(name, argument):
        real = getattr(Dataset, name)

        def method(self, *args, **kwargs):
            if is_standin(self):
                wanted = kwargs.get(argument, args[0] if args else None)
                if isinstance(wanted, dict):
                    wanted = list(wanted)
                self = _with_columns(self, wanted)
            return real(self, *args, **kwargs)
        method.__wrapped__ = real
        return method

    for name, argument in (("select_columns", "column_names"), ("remove_columns", "column_names"),
                           ("rename_column", "original_column_name"), ("rename_columns", "column_mapping"),
                           ("cast_column", "column")):
        if hasattr(Dataset, name):
            patch(Dataset, name, wrap_columns(name, argument))

    def wrap_function(name):
        real = getattr(Dataset, name)

        def method(self, *args, **kwargs):
            if not is_standin(self):
                return real(self, *args, **kwargs)
            if kwargs.get("remove_columns"):
                self = _with_columns(self, kwargs["remove_columns"])
            # in this process: a worker's skipped statements and the keys its rows were asked for would be lost
            kwargs.pop("num_proc", None)
            for _ in range(_RETRIES):
                try:
                    out = real(self, *args, **kwargs)
                    is_standin(out)         # its table is remembered
                    return out
                except KeyError as exc:
                    column = _missing_column(exc, self)
                    if column is None:
                        return _unmapped(self, exc)
                    self = _with_columns(self, [column])
                except Exception as exc:      # noqa: BLE001 - see _unmapped
                    return _unmapped(self, exc)
            return self
        method.__wrapped__ = real
        return method

    def _unmapped(ds, exc):
        # the function failed on placeholder rows (its tokenizer, or the files it reads, are not here
        # either): that says nothing of the real rows, and the data never changes the plan
        if on_failure is not None:
            on_failure(exc)
        return ds

    for name in ("map", "filter"):
        patch(Dataset, name, wrap_function(name))

    real_getitem = Dataset.__getitem__

    def __getitem__(self, key):
        if isinstance(key, str) and is_standin(self) and key not in self.column_names:
            return [placeholder(key)] * len(self)
        return real_getitem(self, key)

    patch(Dataset, "__getitem__", __getitem__)

    real_select = Dataset.select

    def select(self, indices, *args, **kwargs):
        if is_standin(self) and len(self):
            try:
                n = len(self)
                indices = [int(i) % n for i in indices]
            except TypeError:
                pass
        return real_select(self, indices, *args, **kwargs)

    patch(Dataset, "select", select)
