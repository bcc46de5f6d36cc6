"""``model.save_pretrained(folder)`` in a setup (rank 0 keeps a copy of a frozen pretrained component next to the
run's checkpoints): a lint writes no weights, as ``torch.save`` writes nothing in a replay -- the model's weights
are stand-ins here (meta tensors, whose shared storages transformers' check rejects). The folder gets the model's
config (what a later ``from_pretrained(folder)`` of the setup builds the model from; removed after the replay with
everything the replay wrote: `fsdp_lint.replay.writes`), and a note says no weights were written."""
from __future__ import annotations

import os

from fsdp_lint.replay.frameworks.hooks import framework_note


def save_pretrained_hook(hooks, module) -> None:
    """`module`: ``transformers.modeling_utils``."""
    model_class = getattr(module, "PreTrainedModel", None)
    if model_class is None or not hasattr(model_class, "save_pretrained"):
        return

    def make(real):
        def save_pretrained(self, save_directory, *args, **kwargs):
            if kwargs.get("is_main_process", True) is False:
                return None
            os.makedirs(save_directory, exist_ok=True)
            config = getattr(self, "config", None)
            if config is not None and hasattr(config, "save_pretrained"):
                config.save_pretrained(save_directory)
            framework_note(hooks.rec, f"{type(self).__name__}.save_pretrained({os.fspath(save_directory)!r}): its config "
                                      f"only, no weights written (a lint writes no checkpoint)")
            return None
        save_pretrained.__wrapped__ = real
        return save_pretrained

    hooks.wrap(model_class, "save_pretrained", make)
