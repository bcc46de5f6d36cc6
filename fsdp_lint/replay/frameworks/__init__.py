"""Frameworks that wrap the model with FSDP themselves: Lightning, accelerate, the Hugging Face Trainer.

The installed framework decides, fsdp-lint records: during a replay the framework's own code runs on
the meta device with the simulated process group, computes its policy and calls the FSDP APIs, which
are fsdp-lint's recorders. The drivers here only

* fit the framework to the simulated world (Lightning's ``devices``, accelerate's process state),
* stop it at the training boundary (``TrainingBoundary``: Lightning's ``on_fit_start`` or a Fabric
  model's first forward, the HF Trainer's first batch),
* record which framework made each wrap call and the errors it raises for a wrap-class name that
  matches nothing (the plan stage turns them into ``plan.framework`` and FSD103:
  `fsdp_lint.plan.frameworks`),
* read configurations as the framework does (``--accelerate-config``: accelerate's own launcher code
  turns the YAML into the environment ``accelerate launch`` would set),
* build Hugging Face models from a config without downloading (``--hf-config``, ``from_pretrained``;
  diffusers' ``ModelMixin.from_pretrained`` too).

Nothing here imports a framework (or torch) until a replayed file does.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Dict, Iterator, List

# options of the current lint (``--accelerate-config``, ``--hf-config``, ``--hf-class``), set by the
# engine around a replay: the sandbox installs the drivers without knowing the settings
_OPTIONS: List[Any] = []


@contextlib.contextmanager
def configured(options) -> Iterator[None]:
    """Make `options` (a FrameworkOptions) the ones `install` sees while the block runs."""
    _OPTIONS.append(options)
    try:
        yield
    finally:
        _OPTIONS.pop()


def current_options():
    from fsdp_lint.replay.frameworks.options import FrameworkOptions

    return _OPTIONS[-1] if _OPTIONS else FrameworkOptions()


# what torchrun gives each process it starts, and a plain `python` process does not have
PLAIN_PYTHON_UNSET = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK",
                      "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                      "TORCHELASTIC_USE_AGENT_STORE")


def install(rec, patch) -> None:
    """Called by the replay's sandbox after the FSDP recorders are in place."""
    from fsdp_lint.replay.frameworks import accelerate, diffusers, hf, lightning, trackers, trl
    from fsdp_lint.replay.frameworks.hooks import install_hooks, simulate_ddp, simulate_object_collectives

    options = current_options()
    if options.launch_plain:     # `python train.py` from a launch script: no launcher gave it torchrun's variables
        for name in PLAIN_PYTHON_UNSET:
            os.environ.pop(name, None)
    os.environ.update(options.launch_env)        # as the launch line exports it (the sandbox restores it)
    # the launch script's PYTHONPATH (absolute folders): after the script's own folder, as python puts them
    sys.path[1:1] = [f for f in options.launch_env.get("PYTHONPATH", "").split(os.pathsep) if f and f not in sys.path]
    table: Dict[str, List[Any]] = {}
    for driver in (lightning, accelerate, hf, trl, diffusers, trackers):
        for name, fns in driver.hook_table().items():
            table.setdefault(name, []).extend(fns)
    for driver in (accelerate, hf):
        driver.prepare_environment(rec, patch, options)
    simulate_object_collectives(rec, patch)
    simulate_ddp(rec, patch)
    install_hooks(rec, patch, options, table)
