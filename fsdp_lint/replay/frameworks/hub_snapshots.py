"""``huggingface_hub.snapshot_download`` on the simulated node: what the downloaded snapshot holds there.

A node downloads the repository; a lint has no network and reads the local cache, which holds at most what
the setup fetched before (a model's ``config.json``). Two idioms then go wrong here:

* a data set probed with ``snapshot_download(repo_id, repo_type="dataset")`` (then ``load_dataset``) is not
  in the cache: its snapshot stands in as an empty folder (noted); what ``load_dataset`` reads stands in too;
* a model's weights found in its snapshot folder (``glob(snapshot_download(repo, allow_patterns=
  ["*.safetensors"]) + "/*.safetensors")``, SpecForge): the cached snapshot lacks them, and the glob is
  empty. The snapshot stands in as a folder holding what the cache has plus one not-downloaded file per
  weight pattern asked for (``model.safetensors`` for ``*.safetensors``), as ``hf_hub_download`` of a
  weights file gives (`fsdp_lint.replay.frameworks.hf`): loading it stands in as the model's own state dict
  (`fsdp_lint.replay.checkpoints`); the note names the weights.

A model's snapshot that is not in the cache at all is named in the one line (``HUB_FILE``).
"""
from __future__ import annotations

import fnmatch
import os
import shutil
import sys
import tempfile

from fsdp_lint.replay.frameworks.hooks import framework_note
from fsdp_lint.replay.network import HUB_FILE

# the files of pretrained weights (never a config, a tokenizer or an index)
WEIGHT_SUFFIXES = (".bin", ".safetensors", ".pt", ".pth", ".ckpt")
NOT_DOWNLOADED = f"{os.sep}snapshots{os.sep}not-downloaded{os.sep}"
# the names the hub's libraries give a single weights file, tried against a pattern first
_USUAL_NAMES = ("model.safetensors", "pytorch_model.bin", "model.bin", "model.pt", "model.pth", "model.ckpt")


def _weight_names(patterns) -> list:
    """A file name for each weights pattern of `patterns` (``*.safetensors`` -> ``model.safetensors``)."""
    if isinstance(patterns, str):
        patterns = [patterns]
    names = []
    for pattern in patterns or ():
        pattern = str(pattern)
        if not pattern.endswith(WEIGHT_SUFFIXES):
            continue
        name = next((n for n in _USUAL_NAMES if fnmatch.fnmatch(n, pattern)), None)
        if name is None:
            name = pattern.replace("*", "model").replace("?", "0")
            if not fnmatch.fnmatch(name, pattern):
                continue
        if name not in names:
            names.append(name)
    return names


def _with_weights(rec, snapshot: str, repo_id, names: list) -> str:
    """A folder holding `snapshot`'s files and a not-downloaded stand-in for each of `names`."""
    top = tempfile.mkdtemp(prefix="fsdp-lint-snapshot-")
    rec.__dict__.setdefault("after_replay", []).append(lambda: shutil.rmtree(top, ignore_errors=True))
    folder = os.path.join(top, f"models--{str(repo_id).replace('/', '--')}", "snapshots", "not-downloaded")
    os.makedirs(folder)
    for entry in os.listdir(snapshot):
        os.symlink(os.path.join(snapshot, entry), os.path.join(folder, entry))
    for name in names:
        open(os.path.join(folder, name), "wb").close()
    framework_note(rec, f"the weights of the hub model {repo_id} ({', '.join(names)}) are not in the local cache: "
                        f"its snapshot_download stands in with them not downloaded, and loading them stands in")
    return folder


def snapshot_download_hook(hooks, module) -> None:
    """`module`: ``huggingface_hub._snapshot_download`` (see the module's docstring)."""
    from huggingface_hub.utils import LocalEntryNotFoundError     # (huggingface_hub 0.2x and 1.x)

    def make(download):
        def wrapped(*args, **kwargs):
            repo_id = kwargs.get("repo_id") or (args[0] if args else None)
            try:
                snapshot = download(*args, **kwargs)
            except LocalEntryNotFoundError as exc:
                if kwargs.get("repo_type") != "dataset":
                    # a model's snapshot a node downloads: the one line names it, at its revision
                    setattr(exc, HUB_FILE, (repo_id or "?", "", kwargs.get("repo_type"), kwargs.get("revision")))
                    raise
                folder = os.path.join(tempfile.gettempdir(), "fsdp-lint-hub-datasets", *str(repo_id or "dataset").split("/"))
                os.makedirs(folder, exist_ok=True)
                framework_note(hooks.rec, f"the hub data set {repo_id} is not here (a lint has no network): its "
                                          f"snapshot_download stands in as an empty folder")
                return folder
            if kwargs.get("repo_type") not in (None, "model") or kwargs.get("local_dir") \
                    or not isinstance(snapshot, str) or not os.path.isdir(snapshot):
                return snapshot
            present = os.listdir(snapshot)
            wanted = [n for n in _weight_names(kwargs.get("allow_patterns"))
                      if not any(fnmatch.fnmatch(p, "*" + os.path.splitext(n)[1]) for p in present)]
            return _with_weights(hooks.rec, snapshot, repo_id, wanted) if wanted else snapshot
        return wrapped

    hooks.wrap(module, "snapshot_download", make)
    package = sys.modules.get("huggingface_hub")
    if package is not None and "snapshot_download" in vars(package):     # the package's lazy import, resolved
        hooks.patch(package, "snapshot_download", module.snapshot_download)
