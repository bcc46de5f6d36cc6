"""Failures in the setup code: which may be skipped, and what the one-line error names as the cause.

A failing statement of project code is skipped (a data set, tokenizer, checkpoint or config file
that does not exist here) unless the failure belongs to the plan: it was raised while a model was
being constructed, inside a wrap call, a policy, a freeze, a cast or an optimizer, or by fsdp-lint's
recorders. A later failure of a name (``NameError``, ``UnboundLocalError``, ``AttributeError`` of
``self.x``) that a skipped statement should have bound is reported as that earlier failure, not its consequence.
"""
from __future__ import annotations

import ast
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from fsdp_lint.replay import arguments, drift
from fsdp_lint.replay.checkpoints import module_use, used_as_module
from fsdp_lint.replay.stand_ins import stand_in_on_failing_line
from fsdp_lint.replay.framework_checks import raised_by_framework_launch
from fsdp_lint.replay.handlers import PROTOCOL_METHODS, handled_by_the_script
from fsdp_lint.replay.own_raises import (fails_an_import, guard_skipped_before, raised_by_model_validation,
                                         raised_by_the_script, stand_in_before)
from fsdp_lint.replay.imports import MissingImport, StubUse
from fsdp_lint.replay.missing_packages import (MissingPackages, display as _display,
                                               is_fsdp_lint_frame as _is_fsdp_lint_frame, package_hint)
from fsdp_lint.entry.reading import python_requirement_note
from fsdp_lint.replay.requirements import set_project
from fsdp_lint.replay.network import (NetworkWait, NotDownloaded, download_hint, network_ask as _network_ask,
                                      network_text as _network_text, remove_failed_downloads, removed_download)
from fsdp_lint.replay.one_line import one_line as _one_line
from fsdp_lint.replay.records import FSDP_LINT_DIR, Skipped, exception_chain

_FSDP_LINT_DIR = FSDP_LINT_DIR


# the length of a project data set whose data is not here (`Failures.standin_length`)
STANDIN_LENGTH = 1 << 16


@dataclass
class SkipRecord:
    skipped: Skipped
    binds: FrozenSet[str]
    attrs: FrozenSet[str]
    exc: BaseException
    depth: int = 0            # frames on the stack of the skipped statement (trials: which skip ran inside which)
    acted_on: List[object] = field(default_factory=list)   # what its calls acted on (replay.consequences)
    frame: object = None      # the frame it ran in (a guard's `raise` skipped: what ran after it there follows)


@dataclass
class Failures(MissingPackages):
    """The failures of one replay."""
    entry_path: str
    # path -> lines whose failure is never skipped (statements holding a wrap/freeze/cast/optimizer
    # site, headers of blocks holding a wrap)
    fatal_lines: Dict[str, Set[int]] = field(default_factory=dict)
    # path -> line -> a statement that may be skipped (what it binds is worked out when it is)
    tolerant: Dict[str, Dict[int, object]] = field(default_factory=dict)
    # path -> the file's sites, then (once a stand-in failed there) the lines that decide what the wrap is
    # given (replay.deciding): worked out only then -- a slice of every module would cost every lint
    deciding: Dict[str, object] = field(default_factory=dict)
    decided_at: Optional[Tuple[str, int]] = None         # the statement deciding the wrap that a stand-in failed
    # what the script's own handlers caught (replay.caught): (exception, file, line of the `except`)
    caught: List[Tuple[BaseException, str, int]] = field(default_factory=list)
    caught_after_wrap: Optional[Tuple[BaseException, str, int]] = None     # the last of them, once a wrap ran
    refused: Optional[BaseException] = None             # the failure refused there (not skipped further out)
    skips: List[SkipRecord] = field(default_factory=list)
    imports: List[MissingImport] = field(default_factory=list)
    stub_uses: List[StubUse] = field(default_factory=list)
    argv: List[str] = field(default_factory=list)        # the script's arguments
    cycles: List[List[str]] = field(default_factory=list)  # circular imports met (module names, in order)
    resolves_locally: Optional[object] = None            # callable(module name) -> project file or None
    approximated: Optional[object] = None                # callable() -> a collective gave rank 0's values for all

    def __post_init__(self):
        set_project(self.entry_path)        # install hints name the distributions the project declares

    def names_an_argument(self, exc: BaseException) -> bool:
        """A file named in the script's arguments (a config) cannot be read: the launch command is
        wrong here, and skipping it would plan with defaults nobody launches."""
        return arguments.names_an_unreadable_file(exc, self.argv)

    # -- decisions while running ---------------------------------------------------------------
    def may_skip(self, exc: BaseException, frame, line: Optional[int] = None) -> bool:
        """Whether the failure `exc`, caught by the statement running in `frame` (at `line`), may be skipped."""
        from fsdp_lint.replay.records import ReplayError

        if isinstance(exc, (ReplayError, RecursionError, MemoryError)) or self.names_an_argument(exc):
            return False
        if frame.f_code.co_name in PROTOCOL_METHODS:
            return False            # `raise AttributeError(key)` in `__getattr__`: getattr(obj, k, default) takes it
        if line is not None and isinstance(self.tolerant.get(os.path.abspath(frame.f_code.co_filename), {}).get(line),
                                           ast.Assert) and (isinstance(exc, AssertionError) or self.root_cause(exc) is None):
            return False            # the script's own check; only one of what a skipped statement left unbound skips
        if exc is self.refused:
            return False            # refused where it decided the wrap: the statements around it do not skip it
        if line is not None and (self.stub_cause(exc) is not None or isinstance(exc, (NetworkWait, NotDownloaded))) \
                and self.decides_wrap(frame, _line_in(exc, frame, line)):
            self.refused = exc
            return False            # a missing package, the network or a download decides what the wrap is given
        if line is not None and self._changes_the_model_without_a_download(exc, frame, line):
            self.refused = exc
            return False
        if arguments.while_parsing(exc, frame):     # trials: the script refuses its arguments
            return False
        if raised_by_model_validation(exc) or raised_by_framework_launch(exc):   # a real node fails there too
            return False
        if used_as_module(exc) is not None:
            return False            # a checkpoint file that holds a module decides the model: nothing stands in
        if line is not None and not isinstance(exc, (NetworkWait, NotDownloaded)) and self.stub_cause(exc) is None \
                and handled_by_the_script(exc, frame, line, self._is_project_path):
            return False            # the script's own `except` takes it, as on a node (replay.handlers)
        if line is not None and self.stub_cause(exc) is None and stand_in_on_failing_line(exc) is None \
                and self.root_cause(exc) is None and self.acted_on_by_skip(exc) is None \
                and (self._own_refusal(exc) or fails_an_import(exc, frame, self._is_project_path)):
            return False            # the script's own refusal of the launch, a module failing its import (own_raises)
        # raised inside model construction, a wrap/freeze/cast/optimizer statement, or fsdp-lint
        tb = exc.__traceback__
        while tb is not None:
            if self._belongs_to_plan(tb.tb_frame, tb.tb_lineno):
                return False
            tb = tb.tb_next
        # ... or the statement itself runs inside model construction or a policy
        f = frame.f_back
        while f is not None:
            fname = f.f_code.co_filename
            if _is_fsdp_lint_frame(fname):
                if _is_recorder_frame(fname):
                    return False
                break          # the replay's own runner: the top of the user's stack
            if _in_model_init(f):
                return False
            f = f.f_back
        return True

    def _own_refusal(self, exc: BaseException) -> bool:
        # not after a collective that filled every rank's slot with rank 0's values (each rank's share of the
        # data, gathered), nor in a function that used a stand-in before (`len(wds.expand_urls(...))`)
        return stand_in_before(self.stub_uses, exc) is None and not (self.approximated and self.approximated()) \
            and raised_by_the_script(exc, self._is_project_path)

    def _changes_the_model_without_a_download(self, exc: BaseException, frame, line: int) -> bool:
        """A statement that works on a model fails because a download was skipped before it (the tokenizer
        a node downloads, then ``resize_embeddings(tokenizer, model)``): skipping it too would plan the model
        as it was before, a vocabulary the job never trains."""
        from fsdp_lint.replay.consequences import works_on_a_module

        cause = self.root_cause(exc)
        if cause is None or not isinstance(cause.exc, NotDownloaded):
            return False
        stmt = self.tolerant.get(os.path.abspath(frame.f_code.co_filename), {}).get(line)
        return stmt is not None and works_on_a_module(stmt, frame)

    def _is_project_path(self, path: str) -> bool:
        return path == self.entry_path or _is_project(path)

    def standin_length(self, exc: BaseException, frame, line: int, over: bool = False) -> int:
        """The length of a data set whose ``__len__`` (at `line`) fails because the statement that would have
        loaded its data was skipped (a file this machine lacks); any other failure is raised, as it is once the
        replay is `over`. The length is a real data set's order of size (`STANDIN_LENGTH`): every batch size
        and world divide it into steps (a stand-in of a few rows gave a schedule of zero steps per epoch, and
        `global_step // steps_per_epoch` failed)."""
        if over or (self.root_cause(exc) is None and self.acted_on_by_skip(exc) is None):
            raise exc
        self.record_skip(frame.f_code.co_filename, line, exc, frame=frame)
        self.skips[-1].skipped.error += f" (its data set's length stands in as {STANDIN_LENGTH})"
        from fsdp_lint.replay.data_standins import length_stood_in

        length_stood_in(frame.f_locals.get("self"))
        return STANDIN_LENGTH

    def _deciding(self, path: str):
        from fsdp_lint.replay.deciding import Deciding, deciding_lines, imported_deciding

        found = self.deciding.get(path)
        if found is None or isinstance(found, Deciding):
            return found
        self.deciding[path] = Deciding()        # (while it is worked out: an import cycle finds it empty)
        try:
            with open(path, encoding="utf-8-sig") as fh:
                tree = ast.parse(fh.read())
        except (OSError, SyntaxError, ValueError):
            tree = None
        if tree is not None:
            external = imported_deciding(tree, path, self.resolves_locally, self._deciding)
            self.deciding[path] = deciding_lines(tree, found, external)
        return self.deciding[path]

    def decides_wrap(self, frame, line: int) -> bool:
        """Whether the statement at `line` of `frame` decides what a wrap/policy/dtype/freeze site is
        given: in a wrap slice, or in its function's return slice called from such a statement."""
        for _ in range(12):
            path = os.path.abspath(frame.f_code.co_filename)
            decides = self._deciding(path)
            if decides is None:
                return False            # not the project's code (a library calling back)
            if line in decides.wrap_lines or self._is_fatal_line(path, line):
                self.decided_at = (path, line)
                return True
            if line not in decides.return_lines or frame.f_back is None:
                return False
            frame = frame.f_back
            line = frame.f_lineno
        return False

    def after_setup_ok(self, exc: BaseException) -> bool:
        """Whether a failure after the end of the entry's setup may end the replay quietly: not
        when it comes from model construction, a wrap or fsdp-lint."""
        from fsdp_lint.replay.records import ReplayError

        if isinstance(exc, (ReplayError, RecursionError, MemoryError)):
            return False
        tb = exc.__traceback__
        while tb is not None:
            if not _is_fsdp_lint_frame(tb.tb_frame.f_code.co_filename) or _is_recorder_frame(tb.tb_frame.f_code.co_filename):
                if self._belongs_to_plan(tb.tb_frame, tb.tb_lineno):
                    return False
            tb = tb.tb_next
        return True

    def _belongs_to_plan(self, frame, line: int) -> bool:
        fname = frame.f_code.co_filename
        if _is_recorder_frame(fname) or _in_model_init(frame):
            return True
        return self._is_fatal_line(fname, line)

    def _is_fatal_line(self, fname: str, line: int) -> bool:
        lines = self.fatal_lines.get(os.path.abspath(fname))
        if not lines or line not in lines:
            return False
        decides = self._deciding(os.path.abspath(fname))        # (not a freeze of what no wrap is given, nor
        return decides is None or line not in decides.undeciding_sites     # a `prepare` of data only)

    def record_skip(self, path: str, line: int, exc: BaseException, depth: int = 0, frame=None) -> None:
        from fsdp_lint.replay.consequences import acted_on, left_half_set
        from fsdp_lint.replay.ray_node.cluster import raised_in_a_task
        from fsdp_lint.replay.transform import binding

        stmt = self.tolerant.get(os.path.abspath(path), {}).get(line)
        names, attrs = binding(stmt) if stmt is not None else (frozenset(), frozenset())
        stub = stand_in_on_failing_line(exc)       # `super().register(...)` in a class built on a stand-in
        error = _one_line(exc) + (f" {self._uses_stand_in(stub)}" if stub is not None else "") + \
            (raised_in_a_task(exc) or "")
        sk = Skipped(path=os.path.abspath(path), line=line, error=error, exc_type=type(exc).__name__)
        objects = acted_on(stmt, frame) if stmt is not None and frame is not None else []
        objects += [o for o in left_half_set(exc) if all(o is not seen for seen in objects)]
        self.skips.append(SkipRecord(sk, names, attrs, exc, depth, objects, frame))
        if isinstance(exc, NetworkWait) or _network_ask(exc):
            remove_failed_downloads()       # its download's empty file: the statements after it find none

    def acted_on_by_skip(self, exc: BaseException, before: Optional[int] = None) -> Optional[SkipRecord]:
        """The last skipped statement whose calls acted on an object that a frame of the failure
        `exc` holds (``cfg.validate()`` skipped, then ``build_mesh(cfg)`` fails): the later failure
        is likely its consequence."""
        from fsdp_lint.replay.consequences import holds
        from fsdp_lint.replay.missing_inputs import missing_input

        if missing_input(exc):
            return None     # a file, download or the network this machine lacks: its own cause, whatever it shares
        found, before = None, len(self.skips) if before is None else before
        for _ in range(5):              # back along the chain: a skipped failure that follows from an earlier one
            match = next((i for i in range(before - 1, -1, -1)     # the closest one before the failure
                          if self.skips[i].exc is not exc and holds(exc, self.skips[i].acted_on, self._is_project_path)), None)
            if match is None:
                break
            found, before = self.skips[match], match
            exc = found.exc
        return found

    def first_cause(self) -> Optional[SkipRecord]:
        """The skipped failure that the last skipped one goes back to: its chain of unbound names, then the
        first failure skipped inside that statement's own call (a skipped `return` inside a helper makes the
        helper fail later: the skip inside it is the cause)."""
        if not self.skips:
            return None
        root = self.root_cause(self.skips[-1].exc) or self.skips[-1]
        i = self.skips.index(root)
        inner = []
        for rec in reversed(self.skips[:i]):
            if rec.depth <= root.depth:
                break
            inner.append(rec)
        return inner[-1] if inner else root

    # -- the cause of a failure ------------------------------------------------------------------
    def root_cause(self, exc: BaseException, limit: int = 20) -> Optional[SkipRecord]:
        """The skipped statement whose failure `exc` is a consequence of (following chains of
        consequences back to the first failure), or None."""
        found: Optional[SkipRecord] = None
        current: BaseException = exc
        before = len(self.skips)
        for _ in range(limit):
            name, is_attr = _missing_name(current)
            if not name:
                break
            match = None
            for i in range(before - 1, -1, -1):
                rec = self.skips[i]
                if (is_attr and name in rec.attrs) or (not is_attr and name in rec.binds) or \
                        (is_attr is None and (name in rec.binds or name in rec.attrs)):
                    match, before = rec, i
                    break
            if match is None:
                break
            found, current = match, match.exc
        return found

    def decides_note(self, entry_display: str, location: str = "") -> str:
        """``; what it computes decides the wrap's arguments (train.py:36), so it is not skipped`` when a
        failure was refused for that, else "" (the statement is not named again where it is the failure's
        `location`)."""
        if self.decided_at is None:
            return ""
        at = f"{_display(self.decided_at[0], self.entry_path, entry_display)}:{self.decided_at[1]}"
        return f"; what it computes decides the wrap's arguments{'' if at == location else f' ({at})'}, so it is not skipped"

    def describe(self, exc: BaseException, *, entry_display: str, where_real: str,
                 importer=None) -> str:
        """One line naming the cause of `exc`, which ended the replay, and the repository's pins of the
        libraries it failed in that the installed versions do not meet."""
        text = self._describe(exc, entry_display=entry_display, where_real=where_real, importer=importer)
        cause = self.root_cause(exc)
        text += drift.note(cause.exc if cause is not None else exc, self.entry_path)   # (and a newer Python's project)
        text += self._absent_name_before(text, entry_display)
        text += self._caught_after_the_wrap(exc, entry_display)
        text += self._skipped_before(exc, text, entry_display)
        return text if "requires-python" in text else text + python_requirement_note(self.entry_path)

    def _skipped_before(self, exc: BaseException, text: str, entry_display: str) -> str:
        """`` (before it, train.py:23: the data set could not be loaded here and stands in with placeholder rows:
        ValueError: ...)``: a data set this machine lacks was stood in before the failure, which the line does not
        name -- a project check refusing what the placeholder rows give (a data-type tag the folder's files hold)
        fails on the stand-in, not on the node's data."""
        stood_in = [s for s in self.skips if getattr(s.exc, "fsdp_lint_data_stand_in", False) and s.exc is not exc]
        if not stood_in or any(s.skipped.error in text for s in stood_in):
            return ""
        first = stood_in[0].skipped
        return (f" (before it, {_display(first.path, self.entry_path, entry_display)}:{first.line}: the data set could not "
                f"be loaded here and stands in with placeholder rows: {first.error})")

    def _caught_after_the_wrap(self, exc: BaseException, entry_display: str) -> str:
        """`` (before it, after the wrap, the script's `except` at train.py:106 caught: ...)``: what failed in the
        call that wrapped -- the data a trainer reads next -- is the cause of what the script fails on after its
        handler (the stats training would have written), not that."""
        if self.caught_after_wrap is None:
            return ""
        caught, path, line = self.caught_after_wrap
        if any(e is caught for e in exception_chain(exc)):
            return ""           # the failure is that one, raised again
        return (f" (before it, after the wrap, the script's `except` at {_display(path, self.entry_path, entry_display)}"
                f":{line} caught: {_one_line(caught)})")

    def _absent_name_before(self, text: str, entry_display: str) -> str:
        """`` (before it, pkg/outputs.py:3: cannot import name ... (the installed transformers 5.25.0; pyproject.toml
        asks for transformers==5.9.0): `python` stops there; fsdp-lint stood in for it)``: a name an installed
        library lacks was stood in for, so what failed later may be the drift's doing, never seen on a node."""
        imp = next((i for i in self.imports if i.absent_names and i.message not in text), None)
        if imp is None:
            return ""
        return (f" (before it, {_display(imp.path, self.entry_path, entry_display)}:{imp.line}: {imp.message} "
                f"({drift.lacking(imp.module, self.entry_path, imp.message)}): `python` stops there; fsdp-lint stood in for it)")

    def _describe(self, exc: BaseException, *, entry_display: str, where_real: str, importer=None) -> str:
        stub = self.stub_cause(exc)
        if stub is not None and stub.in_model:
            return self._stub_message(stub, entry_display)
        if stub is not None and not (isinstance(exc, NameError) and self.root_cause(exc) is not None):
            # setup code (not the model) failed on a stand-in: the package it needs is the cause (unless it
            # failed on a name a skipped statement would have bound: that statement's failure is the first)
            loc, msg = self._location(exc, entry_display), _one_line(exc)
            if "which could not be imported" in msg:    # the stand-in's own message names the package already
                return f"{loc}: setup code failed {where_real}: {msg}{self.decides_note(entry_display, loc)}"
            return f"{loc}: setup code failed {where_real}: {msg} {self._uses_stand_in(stub, self.decides_note(entry_display))}"
        checkpoint = used_as_module(exc, any_attribute=True)
        if checkpoint is not None:
            url = "://" in checkpoint       # (torch.hub's download of a URL: the file goes in torch's hub cache)
            shown = checkpoint if url else _display(checkpoint, self.entry_path, entry_display)
            where = f"put it in torch's hub cache ({_hub_checkpoints()})" if url else "copy it here"
            return (f"{self._location(exc, entry_display)}: `{shown}` is not on this machine, and the setup uses "
                    f"what it loads {module_use(exc)}: the file decides the model, so there is no plan without it -- "
                    f"lint where the file is, or {where}")
        parsing = None if self.names_an_argument(exc) else \
            arguments.describe(exc, self._location(exc, entry_display), self.argv, entry_display, _one_line)
        if parsing:                                 # trials: the script refuses its arguments
            return parsing
        cause = self.root_cause(exc)
        later = ""
        if cause is not None:       # a name the skipped statement would have bound: its failure, and before it...
            if exc is self.refused:  # the later statement works on the model: skipping it too would plan another
                later = f" (skipped; what it would have set up was used later: {self._location(exc, entry_display)}: " \
                        f"{_one_line(exc)})"
            if stub is not None:     # ... and the stand-in the later line also used
                later += f" {self._uses_stand_in(stub)}"
            exc = cause.exc
            # the line in the skipped statement that failed (a call in the branch of an `if`), else the statement
            loc = self._location(exc, entry_display, f"{_display(cause.skipped.path, self.entry_path, entry_display)}:{cause.skipped.line}")
            earlier = self.acted_on_by_skip(exc, before=self.skips.index(cause)) or guard_skipped_before(self.skips, exc)
            stub = self.stub_cause(exc)
            if stub is not None and earlier is None:    # the first failure worked on a stand-in: its package
                return f"{loc}: setup code failed {where_real}: {_one_line(exc)} {self._uses_stand_in(stub)}{later}"
        else:
            loc = self._location(exc, entry_display)
            earlier = self.acted_on_by_skip(exc) or guard_skipped_before(self.skips, exc)
        if removed_download(exc):        # the download a statement skipped for the network would have written
            earlier = next((r for r in reversed(self.skips) if _network_ask(r.exc) or isinstance(r.exc, NetworkWait)),
                           earlier)
        missing_input = self._skipped_missing_input()
        linked = "what it would have set up was used later"
        if missing_input is not None and missing_input.exc is not exc:
            if earlier is None:            # (the later failure reads nothing it sets: named, not linked)
                linked = "later, not from it"
            earlier = missing_input        # a model config fsdp-lint never downloads: what the rest follows from
        if earlier is not None:
            # the skipped statement first: what failed here left the object half-set -- itself failing on a name
            # an earlier skipped statement would have bound (`validate(args, tokenizer.n_words)` after the
            # tokenizer's statement failed): that one
            earlier = self.root_cause(earlier.exc) or earlier
            at = f"{_display(earlier.skipped.path, self.entry_path, entry_display)}:{earlier.skipped.line}"
            if _network_ask(earlier.exc) or isinstance(earlier.exc, NetworkWait):
                return f"{at}: {_network_text(earlier.exc)} (skipped; {linked}: {loc}: {_one_line(exc)})"
            return (f"{at}: setup code failed {where_real}: {earlier.skipped.error}{download_hint(earlier.skipped.error, earlier.exc)}"
                    f"{package_hint(earlier.exc, earlier.skipped.error)}"
                    f" (skipped; {linked}: {loc}: {_one_line(exc)})")
        if isinstance(exc, ImportError):
            text = self.describe_import_error(exc, importer)
            if text:
                return f"{loc}: {text}"
        if self.names_an_argument(exc):
            return (f"{loc}: `{exc.filename}`, named in the script's arguments, cannot be read "
                    f"({exc.strerror or type(exc).__name__}); paths in the arguments are relative to "
                    f"{os.getcwd()}")
        msg = _one_line(exc)
        if raised_by_model_validation(exc):
            return f"{loc}: {msg} (torch's own check of the model: the script fails on this line on a GPU node too)"
        if self._own_refusal(exc):
            return f"{loc}: {msg} (the script's own check of what the node gives it: it stops there on a GPU node too)"
        before = stand_in_before(self.stub_uses, exc)
        if before is not None:      # the failing check reads what a stand-in gave earlier in the function
            return f"{loc}: setup code failed {where_real}: {msg} {self._uses_stand_in(before)}"
        if raised_by_the_script(exc, self._is_project_path):
            return (f"{loc}: {msg} (the script's own check, after a collective here gave every rank's slot rank 0's "
                    f"value -- each rank's own share on a node, which the check may depend on)")
        if _network_ask(exc):
            return f"{loc}: {_network_text(exc)}"
        hint = package_hint(exc, msg) or self._stub_hint(msg)
        decides = self.decides_note(entry_display, loc) if exc is self.refused else ""
        return (f"{loc}: setup code failed {where_real}: {msg}{download_hint(msg, exc)}{hint}{decides}{later}"
                f"{self._unlinked_skip_before(exc, entry_display)}")

    def _unlinked_skip_before(self, exc: BaseException, entry_display: str) -> str:
        """An earlier failure skipped in the script's own statements that the one reported does not follow from
        (a data set's size computed from a placeholder, then a keyword the library lacks): named too, as python
        on a node would stop at it first where it fails there as well."""
        from fsdp_lint.replay.consequences import held_at_top_level
        from fsdp_lint.replay.missing_inputs import missing_input

        upto = next((i for i, r in enumerate(self.skips) if r.exc is exc), len(self.skips))     # (before it only)
        first = next((r for r in self.skips[:upto] if not missing_input(r.exc) and not _network_ask(r.exc) and
                      not getattr(r.exc, "fsdp_lint_data_stand_in", False) and
                      self.root_cause(r.exc) is None and held_at_top_level(exc, r.acted_on, self._is_project_path)),
                     None)
        if first is None:
            return ""
        return (f" (before it, {_display(first.skipped.path, self.entry_path, entry_display)}:{first.skipped.line} "
                f"failed here too and was skipped: {first.skipped.error})")

    def _skipped_missing_input(self) -> Optional[SkipRecord]:
        """The first skipped failure for a model's hub config that is not here (fsdp-lint never downloads):
        a framework that catches it builds on without a model, and fails far from the cause."""
        from fsdp_lint.replay.frameworks.hf import HubConfigMissing

        return next((r for r in self.skips if isinstance(r.exc, HubConfigMissing)), None)

    def _location(self, exc: BaseException, entry_display: str, fallback: str = "") -> str:
        """The innermost frame of the user's code: project frames from the top of the user's stack
        down to where the code enters fsdp-lint again (a recorder) -- what runs below a recorder is
        torch's or fsdp-lint's, not the user's. fsdp-lint's shims on the way (the launcher's, Hydra's
        app, a framework hook) are passed through: the user's code runs on below them."""
        frames = traceback.extract_tb(exc.__traceback__)
        i = 0
        while i < len(frames) and _is_fsdp_lint_frame(frames[i].filename):
            i += 1
        innermost = None
        while i < len(frames) and not _is_recorder_frame(frames[i].filename):
            if _is_fsdp_lint_frame(frames[i].filename):
                pass
            elif _is_project(frames[i].filename) or os.path.abspath(frames[i].filename) == self.entry_path:
                innermost = frames[i]
            i += 1
        if innermost is None:
            return fallback or entry_display
        return f"{_display(innermost.filename, self.entry_path, entry_display)}:{innermost.lineno}"

# --------------------------------------------------------------------------------------------
# torch's own checks of a model, its names, shapes and options (issue 18): what they refuse, they
# refuse on a GPU node too -- the script's bug, never a gap of the simulation to skip
def _line_in(exc: BaseException, frame, line: int) -> int:
    """The line of `frame` that `exc` came from (inside the block statement at `line`)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame is frame:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _missing_name(exc: BaseException) -> Tuple[Optional[str], Optional[bool]]:
    """(name, is an attribute) that `exc` says is missing, or (None, None)."""
    if isinstance(exc, (NameError, UnboundLocalError)):
        name = getattr(exc, "name", None)
        if not name:
            m = re.search(r"'([A-Za-z_][A-Za-z0-9_]*)'", str(exc))
            name = m.group(1) if m else None
        return name, False
    if isinstance(exc, AttributeError):
        name = getattr(exc, "name", None)
        if not name:
            m = re.search(r"has no attribute '([A-Za-z_][A-Za-z0-9_]*)'", str(exc))
            name = m.group(1) if m else None
        return name, True
    return None, None


def _in_model_init(frame) -> bool:
    if frame.f_code.co_name != "__init__":
        return False
    obj = frame.f_locals.get("self")
    if obj is None:
        return False
    nn = sys.modules.get("torch.nn")
    return nn is not None and isinstance(obj, nn.Module)


def _is_recorder_frame(fname: str) -> bool:
    """fsdp-lint code that runs on the linted code's behalf (recorders, policy resolution)."""
    if not _is_fsdp_lint_frame(fname):
        return False
    base = os.path.basename(fname)
    return base in ("recorders.py", "plan.py")


def _is_project(fname: str) -> bool:
    from fsdp_lint.entry.project import is_local

    return is_local(fname)


def _hub_checkpoints() -> str:
    import torch.hub

    return os.path.join(torch.hub.get_dir(), "checkpoints")

