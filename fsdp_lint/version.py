"""The package version (one place: the CLI, the reports and the package read it here)."""
__version__ = "0.1.0"
