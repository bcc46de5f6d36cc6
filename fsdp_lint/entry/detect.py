"""Which calls in a file hand the model to a framework that wraps it with FSDP (no torch import).

`source` marks these calls as relevant to the wrap plan, so that the replay runs them (the framework's
own code then calls the recorded FSDP APIs) instead of stopping before them.
"""
from __future__ import annotations

from typing import Optional, Set

# top-level package -> framework name (what `plan.framework` says)
FRAMEWORK_PACKAGES = {
    "lightning": "lightning", "pytorch_lightning": "lightning", "lightning_fabric": "lightning",
    "accelerate": "accelerate",
    "transformers": "transformers", "trl": "transformers", "peft": "peft",
    "ray": "ray",
}

# (framework, receiver word, method names): `trainer.fit(model)`, `fabric.setup(model)`,
# `accelerator.prepare(model, optimizer)`, `trainer.train()`. The receiver's name is how real
# scripts spell these objects (``trainer``, ``self.fabric``, ``accelerator``, ``L.Trainer(...)``).
_CALLS = (
    ("lightning", "trainer", {"fit", "validate", "test", "predict"}),
    ("lightning", "fabric", {"setup", "setup_module"}),
    ("accelerate", "accelerator", {"prepare", "prepare_model"}),
    ("transformers", "trainer", {"train"}),
    # Ray Train: `ray.train.torch.prepare_model(model, parallel_strategy="fsdp")` wraps in a worker that
    # `TorchTrainer(loop, ...).fit()` runs (the simulated node's Ray: fsdp_lint.replay.ray_node.train)
    ("ray", "torch", {"prepare_model"}),
    ("ray", "trainer", {"fit"}),
)


def framework_call(dotted: str, imported: Set[str]) -> Optional[str]:
    """The framework a call like ``trainer.fit`` (dotted callee) drives, given the frameworks the
    file imports (values of FRAMEWORK_PACKAGES); None for any other call."""
    receiver, _, method = dotted.rpartition(".")
    if not receiver:
        return None
    receiver = receiver.lower()
    for framework, word, methods in _CALLS:
        if framework in imported and method in methods and word in receiver:
            return framework
    return None


def imported_framework(module: str) -> Optional[str]:
    """`lightning.pytorch.strategies` -> "lightning"; None for other modules."""
    return FRAMEWORK_PACKAGES.get(module.split(".")[0]) if module else None


# the extra that installs each framework package
EXTRAS = {"lightning": "lightning", "pytorch_lightning": "lightning", "lightning_fabric": "lightning",
          "accelerate": "hf", "transformers": "hf", "peft": "hf", "trl": "trl"}


def missing_packages(packages) -> list:
    """The framework packages among `packages` that cannot be imported here."""
    import importlib.util

    # (Ray is the simulated node's own: fsdp_lint.replay.ray_node, installed here or not)
    return sorted(p for p in packages if p != "ray" and importlib.util.find_spec(p) is None)


def install_hint(packages) -> str:
    extras = sorted({EXTRAS.get(p, "hf") for p in packages})
    spec = "fsdp-lint[" + ",".join(extras) + "]"
    return (f"{', '.join(packages)} {'is' if len(packages) == 1 else 'are'} not installed here, and fsdp-lint lints "
            f"framework code by running the installed framework: pip install '{spec}'")
