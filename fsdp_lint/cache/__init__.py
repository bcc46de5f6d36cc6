"""The result cache (ruff's model): a re-run with nothing changed prints the same report without
importing torch or running any of the project's code.

The front door consults it after screening, before a file goes to a child process: a hit is the
FileResult a child built before for the same key (``fsdp_lint.cache.key``: the entry file and every
project module it reaches, argv, settings, the interpreter and installed distributions, the config
files and environment variables it can read). What is stored: results of lints that finished --
clean, with findings, or skipped by the child -- never errors (exit code 2: a timeout, a missing data
set or package is more often fixed in the environment than in the key, and a re-run of a failing file
should try again), and nothing under --run or --simulate (their point is to run).
"""
from fsdp_lint.cache.key import run_key
from fsdp_lint.cache.store import DEFAULT_DIR, Cache, default_dir

__all__ = ["Cache", "DEFAULT_DIR", "default_dir", "run_key"]
