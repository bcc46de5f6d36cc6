"""Experiment trackers never log remotely from a lint.

The sandbox sets ``WANDB_MODE=disabled``; a script that passes its own mode (``wandb.init(mode="offline" if
args.wandb_offline else "online")``, ``settings=wandb.Settings(mode="online")``) beats the environment, and
its init then asks for a login this machine does not have (a skipped statement, a note, or -- where a
later line follows from it -- the headline). Patched for the replay only: every ``wandb.init`` runs disabled
(a disabled run takes ``config.update``, ``log`` and ``finish`` as a real one does; the script's own offline
fallback after a failed online init is never needed, and works the same), and ``wandb.login`` answers
that it is logged in without asking anyone.
"""
from __future__ import annotations

from typing import Any, Dict, List

DISABLED = "disabled"


def _disabled_settings(settings):
    if isinstance(settings, dict):
        return {**settings, "mode": DISABLED} if "mode" in settings else settings
    if settings is not None and getattr(settings, "mode", DISABLED) != DISABLED:
        try:
            settings.mode = DISABLED
        except Exception:  # noqa: BLE001  a frozen settings object: the `mode` argument decides then
            pass
    return settings


def _wandb(hooks, module) -> None:
    def make_init(init):
        def disabled_init(*args, **kwargs):
            kwargs["mode"] = DISABLED
            if "settings" in kwargs:
                kwargs["settings"] = _disabled_settings(kwargs["settings"])
            return init(*args, **kwargs)
        return disabled_init

    def make_login(login):
        def logged_in(*args, **kwargs):
            return True
        return logged_in

    if callable(getattr(module, "init", None)):
        hooks.wrap(module, "init", make_init)
    if callable(getattr(module, "login", None)):
        hooks.wrap(module, "login", make_login)


def hook_table() -> Dict[str, List[Any]]:
    return {"wandb": [_wandb]}
