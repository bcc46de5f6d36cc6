"""How a project really launches a file that is not run as ``python FILE``: read from syntax (no imports).

* **A command line of the project** calls it: ``litgpt pretrain ...`` is a console script
  (``[project.scripts]`` of pyproject.toml, ``console_scripts`` of setup.cfg/setup.py) or the package's
  ``__main__.py`` (``python -m litgpt pretrain``) that imports the file's function and dispatches to it
  by a subcommand name (a dict ``{"pretrain": setup}``, ``jsonargparse.CLI``/``fire``/``typer``). A
  file without a ``__main__`` block that builds nothing at import does nothing as a script: the
  launch to lint is that command line (`cli_launches`).
* A module of a namespace package launched with ``python -m`` is resolved by ``project.entry_for``.
"""
from __future__ import annotations

import ast
import configparser
import os
import re
from dataclasses import dataclass
from typing import List, Optional

from fsdp_lint.entry.project import Entry, Project, repo_root


@dataclass
class Launch:
    command: str          # "litlm pretrain" / "python -m litlm pretrain"
    cli_path: str         # the file whose main the command runs
    subcommand: str       # "pretrain" ("" when the command runs the file's function directly)

    def lint_hint(self, shown) -> str:
        sub = f" {self.subcommand}" if self.subcommand else ""
        return f"fsdp-lint {shown(self.cli_path)} --{sub} ARGS"


def console_scripts(repo: str) -> List[tuple]:
    """(command name, "module:function") of the repository's console scripts."""
    out: List[tuple] = []
    pyproject = os.path.join(repo, "pyproject.toml")
    if os.path.isfile(pyproject):
        try:
            import tomllib
        except ImportError:  # Python < 3.11
            tomllib = None
        if tomllib is not None:
            try:
                with open(pyproject, "rb") as fh:
                    doc = tomllib.load(fh)
                scripts = (doc.get("project") or {}).get("scripts") or {}
                poetry = ((doc.get("tool") or {}).get("poetry") or {}).get("scripts") or {}
                out += [(k, v) for k, v in {**poetry, **scripts}.items() if isinstance(v, str)]
            except (OSError, ValueError):
                pass
    cfg = os.path.join(repo, "setup.cfg")
    if os.path.isfile(cfg):
        parser = configparser.ConfigParser()
        try:
            parser.read(cfg)
            text = parser.get("options.entry_points", "console_scripts", fallback="")
            out += [tuple(x.strip() for x in ln.split("=", 1)) for ln in text.splitlines() if "=" in ln]
        except configparser.Error:
            pass
    setup = os.path.join(repo, "setup.py")
    if os.path.isfile(setup):
        try:
            with open(setup, encoding="utf-8-sig") as fh:
                text = fh.read()
            out += [(a.strip(), b.strip()) for a, b in re.findall(r"[\"']\s*([\w.-]+)\s*=\s*([\w.]+:[\w.]+)\s*[\"']", text)]
        except OSError:
            pass
    return out


def _subcommand(cli_path: str, entry_module: str, project: Project, entry_path: str) -> Optional[str]:
    """The subcommand by which `cli_path` dispatches to a function imported from the entry's module
    ("" when it calls it without one), or None when it does not import the entry at all."""
    try:
        with open(cli_path, encoding="utf-8-sig") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    aliases, module_aliases = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if project.resolve(node.module) == entry_path:
                aliases |= {a.asname or a.name for a in node.names}
            for a in node.names:
                if project.resolve(f"{node.module}.{a.name}") == entry_path:
                    module_aliases.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if project.resolve(a.name) == entry_path:
                    module_aliases.add(a.asname or a.name.split(".")[0])
    if not aliases and not module_aliases:
        return None

    def names_entry(value) -> bool:
        if isinstance(value, ast.Name):
            return value.id in aliases or value.id in module_aliases
        if isinstance(value, ast.Attribute):
            return names_entry(value.value)
        return False

    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and names_entry(value):
                    return key.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            # subparsers.add_parser("pretrain") / app.command("pretrain")(fn) style registrations
            first = node.args[0]
            if node.func.attr in ("add_parser", "command") and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str) and first.value == os.path.splitext(os.path.basename(entry_path))[0]:
                return first.value
    return ""


def cli_launches(entry: Entry) -> List[Launch]:
    """The project's command lines that call the entry file (console scripts first, then the
    package's ``__main__.py``)."""
    repo = repo_root(entry.path)
    if repo is None:
        return []
    project = Project(entry)
    out: List[Launch] = []
    for name, target in console_scripts(repo):
        module = target.split(":", 1)[0].strip()
        path = project.resolve(module)
        if path is None or path == entry.path:
            continue
        sub = _subcommand(path, entry.module, project, entry.path)
        if sub is not None:
            out.append(Launch(f"{name} {sub}".strip(), path, sub))
    if entry.is_package_module:
        top = entry.package.split(".")[0]
        main = project.resolve(f"{top}.__main__")
        if main and main != entry.path and not any(l.cli_path == main for l in out):
            sub = _subcommand(main, entry.module, project, entry.path)
            if sub is not None:
                out.append(Launch(f"python -m {top} {sub}".strip(), main, sub))
    return out
