"""fsdp-lint: a static model-inspection and wrap-policy linter for PyTorch FSDP."""
from fsdp_lint.version import __version__

__all__ = ["record", "lint_module", "__version__"]


def __getattr__(name):
    # the Python API (fsdp_lint.record(), fsdp_lint.lint_module()) imports torch: only when it is used
    if name in ("record", "lint_module"):
        from fsdp_lint import api

        return getattr(api, name)
    raise AttributeError(f"module 'fsdp_lint' has no attribute {name!r}")
