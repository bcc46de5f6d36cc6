"""fsdp-lint: a static model-inspection and wrap-policy linter for PyTorch FSDP."""
__version__ = "0.1.0"
