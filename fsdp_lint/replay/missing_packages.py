"""What a failure that involves a package not installed here names: the stand-in fsdp-lint used for it, the
package (and its distribution) to install, a circular import, a module the project lacks.

`MissingPackages` is the part of `replay.failures.Failures` that words these: it reads the failed imports
(`imports`), the stand-ins' uses (`stub_uses`), the import cycles met (`cycles`) and the project's own
modules (`resolves_locally`) that the replay recorded.
"""
from __future__ import annotations

import os
from typing import List, Optional

from fsdp_lint.replay import drift
from fsdp_lint.replay.imports import (StubUse, circular_module, distribution_of, is_circular, missing_module_of,
                                      package_behind, requirement)
from fsdp_lint.replay.one_line import one_line as _one_line
from fsdp_lint.replay.records import FSDP_LINT_DIR
from fsdp_lint.replay.stand_ins import stand_in_on_failing_line


class MissingPackages:
    """The texts of failures that a package not installed here is behind (a mixin of `Failures`)."""

    def _uses_stand_in(self, stub: StubUse, decides: str = "") -> str:
        """``(it uses `catalogue.Registry`, which could not be imported: <why>)``"""
        top = stub.name.split(".")[0].split("(")[0]
        imp = next((i for i in self.imports if top in i.names or i.module.lstrip(".").split(".")[0] == top), None)
        need = (f"{imp.message} ({drift.lacking(imp.module, self.entry_path, imp.message)})" if imp is not None and imp.absent_names
                else self._not_importable(imp.missing if imp is not None else top, imp))
        return f"(it uses `{stub.name.rstrip('()')}`, which could not be imported: {need}{decides})"

    def describe_import_error(self, exc: ImportError, importer=None) -> Optional[str]:
        if is_circular(exc):
            mod = circular_module(exc)
            chain = next((c for c in reversed(self.cycles) if c and c[-1] == mod), None)
            if chain:
                names = " -> ".join(chain)
                return (f"circular import: {names} ({mod} is imported again before it has finished importing; "
                        f"`python` fails the same way)")
            return f"circular import of {mod}: {_one_line(exc)}"
        missing = missing_module_of(exc)
        if missing:
            top = missing.split(".")[0]
            if "." in missing and self.resolves_locally is not None and self.resolves_locally(top):
                return (f"the project has no module `{missing}` (its package `{top}` is here, that module is not); "
                        f"check the import, or the checkout")
            return (f"`{missing}` is not installed here (pip install {distribution_of(missing)}); "
                    f"install the training repository's dependencies to lint it")
        return None

    def import_notes(self, shown) -> List[str]:
        """The notes on the imports stood in for that the model does not use: packages not installed here, installed
        ones whose import fails here (built for another torch), names an installed version lacks."""
        notes: List[str] = []
        unused = [i for i in self.imports if not i.local and not i.absent_names]
        broken = [i for i in unused if _installed(i.missing) and not i.message.startswith("No module named")]
        missing = [i for i in unused if i not in broken]
        if missing:
            notes.append("not installed here, stood in for (not used by the model): "
                         + ", ".join(dict.fromkeys(i.missing for i in missing)))
        for imp in dict((i.missing, i) for i in broken).values():
            notes.append(f"{shown(imp.path)}:{imp.line}: `{imp.missing}` is installed, but importing it fails here: "
                         f"{imp.message}; `python` stops there, fsdp-lint stood in for it (not used by the model)")
        for imp in self.imports:
            if imp.absent_names:
                notes.append(f"{shown(imp.path)}:{imp.line}: {imp.message} "
                             f"({drift.lacking(imp.module, self.entry_path, imp.message)}); "
                             f"`python` stops there, fsdp-lint stood in for it (not used by the model)")
        return notes

    def _stub_hint(self, msg: str) -> str:
        if ("not installed here" in msg or "does not have it" in msg) and self.imports:
            return ""           # the message names the cause already (a stand-in's own message)
        for imp in self.imports:
            if imp.missing and imp.missing.split(".")[0] in msg:
                if imp.absent_names:      # the package is installed: its version lacks the name
                    return (f" ({imp.message}: the installed {drift.installed(imp.module, self.entry_path)} does not have it; "
                            f"the training repository needs another version)")
                return f" (`{imp.missing}` is not installed here: pip install {requirement(imp)})"
        return ""

    # -- stand-ins used by the model -------------------------------------------------------------
    def stub_cause(self, exc: BaseException) -> Optional[StubUse]:
        """A use of a stand-in (for an import that failed) that `exc` comes from: in the model, or
        on a line of the failure's traceback."""
        lines = set()
        tb = exc.__traceback__
        while tb is not None:
            lines.add((os.path.abspath(tb.tb_frame.f_code.co_filename), tb.tb_lineno))
            tb = tb.tb_next
        for u in self.stub_uses:
            if u.in_model or (os.path.abspath(u.path), u.line) in lines:
                return u
        return stand_in_on_failing_line(exc)

    def incomplete_plan(self, entry_display: str) -> Optional[str]:
        """The message when a stand-in for something not installed was used while the model was
        built or wrapped: the plan would silently miss what it stands for."""
        used = [u for u in self.stub_uses if u.in_model]
        return self._stub_message(used[0], entry_display) if used else None

    def stand_in_called(self, u: StubUse, entry_display: str) -> str:
        """``train.py:14: the setup calls `fs2lib.load_base_model._factory()`, which could not be imported here
        (`fs2lib` is not installed: pip install fs2lib)``: a call of a stand-in, said as the cause."""
        top = u.name.split(".")[0].split("(")[0]
        imp = next((i for i in self.imports if top in i.names or i.module.lstrip(".").split(".")[0] == top), None)
        missing = imp.missing if imp is not None else top
        return (f"{display(u.path, self.entry_path, entry_display)}:{u.line}: the setup calls `{u.name}`, which could "
                f"not be imported here ({self._not_importable(missing, imp, where='')})")

    def _stub_message(self, u: StubUse, entry_display: str) -> str:
        top = u.name.split(".")[0].split("(")[0]
        imp = next((i for i in self.imports if top in i.names or i.module.lstrip(".").split(".")[0] == top), None)
        missing = imp.missing if imp is not None else top
        where = f"{display(u.path, self.entry_path, entry_display)}:{u.line}"
        if is_fsdp_lint_frame(u.path) and imp is not None:
            # used where fsdp-lint read what the file handed it (the recorder walking a stand-in model):
            # the import's own line is the user's
            where = f"{display(imp.path, self.entry_path, entry_display)}:{imp.line}"
        if imp is not None and imp.absent_names:
            lacks = drift.lacking(imp.module, self.entry_path, imp.message)
            if lacks.startswith("the installed"):
                lacks += "; the training repository needs another version"
            return (f"{where}: {u.user} uses `{u.name.rstrip('()')}`, which could not be imported here: "
                    f"{imp.message} ({lacks}); the plan would be built without it")
        return (f"{where}: {u.user} uses `{u.name.rstrip('()')}`, which could not be imported here "
                f"({self._not_importable(missing, imp, where='')}); the plan would be built without it")

    def _not_importable(self, missing: str, imp, where: str = " here") -> str:
        """Why module `missing` is not here: not installed, not in the installed package (a prototype API
        torch has since removed), or not in the project whose package is here."""
        import importlib.util

        from fsdp_lint.replay.own_packages import own_package

        top = missing.split(".")[0]
        if "." in missing and self.resolves_locally is not None and self.resolves_locally(top):
            return f"the project has no module `{missing}` (its package `{top}` is here, that module is not)"
        if importlib.util.find_spec(top) is not None and drift.failed_inside(missing, imp, self.entry_path):
            return drift.failed_inside(missing, imp, self.entry_path)
        spec = importlib.util.find_spec(top) if "." in missing else None
        if spec is not None and spec.origin not in (None, "namespace"):
            # (a namespace package -- `google` -- is shared by distributions: google.protobuf is protobuf's)
            return (f"`{missing}` is not in the installed {drift.installed(top, self.entry_path)} (the training repository needs "
                    f"another version)")
        return own_package(top, self.entry_path) or \
            f"`{missing}` is not installed{where}: pip install {requirement(imp) if imp is not None else distribution_of(missing)}"


def is_fsdp_lint_frame(fname: str) -> bool:
    return os.path.abspath(fname).startswith(FSDP_LINT_DIR + os.sep)


def display(path: str, entry_path: str, entry_display: str) -> str:
    """`path` as the one-line error shows it: the entry as the user named it, else relative to the working folder."""
    path = os.path.abspath(path)
    if path == entry_path:
        return entry_display
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel

def package_hint(exc: BaseException, msg: str) -> str:
    """`` (`streaming` is not installed here: pip install mosaicml-streaming)`` when a package that is not
    installed is behind `exc` and `msg` does not name it already."""
    top = package_behind(exc)
    if not top or f"`{top}`" in msg or f"'{top}'" in msg:
        return ""
    return f" (`{top}` is not installed here: pip install {distribution_of(top)})"


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False
