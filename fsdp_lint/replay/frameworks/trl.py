"""TRL's ``SFTTrainer`` is a Hugging Face Trainer: the HF driver wraps and stops it as any Trainer.

TRL checks and prepares its data in ``__init__`` (``train_dataset`` must be a ``datasets.Dataset``; it is
tokenized and packed there), so the placeholder that stands in for a data set that cannot be loaded here
(the hub is offline for a lint) would stop it before the model is wrapped. Patched for the replay only:
a placeholder train/eval data set becomes a one-row ``datasets.Dataset`` with the text column the
config names (``dataset_text_field``). The data does not change the plan, and no batch is ever drawn.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, List

FRAMEWORK = "transformers"


def _placeholder(args):
    from datasets import Dataset

    field = getattr(args, "dataset_text_field", None) or "text"
    return Dataset.from_dict({field: ["a placeholder sample: the data set cannot be loaded here"]})


def _sft(hooks, module) -> None:
    from fsdp_lint.replay.imports import Missing

    def make(init):
        signature = inspect.signature(init)

        def __init__(self, *args, **kwargs):
            try:
                bound = signature.bind_partial(self, *args, **kwargs)
            except TypeError:
                return init(self, *args, **kwargs)      # TRL raises its own error
            for name in ("train_dataset", "eval_dataset"):
                if isinstance(bound.arguments.get(name), Missing):
                    bound.arguments[name] = _placeholder(bound.arguments.get("args"))
            return init(*bound.args, **bound.kwargs)
        return __init__

    hooks.wrap(module.SFTTrainer, "__init__", make)


def hook_table() -> Dict[str, List[Any]]:
    return {"trl.trainer.sft_trainer": [_sft]}
