"""Refusals that stop every rank of a node too: torch's own checks of the model, and the setup code's own
`raise` or `assert` of what the node gives it.

Setup code validates its launch before it builds anything:

    if dp_degree * dp_shards != world_size:
        raise ValueError(f"World size {world_size} must equal dp_degree * dp_shards")
    assert cfg.batch_size % world_size == 0, "the batch must divide by the world"

Skipping such a statement as a failure of the simulated node planned a job that never starts (`-n 4` for a
script written for 8). The refusal is the script's when it is raised by a ``raise``/``assert`` statement
of the project itself about the launch (its test or message talks of the world, ranks, GPUs, nodes, parallel
degrees or meshes), of a validation kind (ValueError, AssertionError, RuntimeError, TypeError,
NotImplementedError), from values the node gives: no stand-in on the failing line, no earlier skipped
statement it follows from, no file-system probe in its test (``os.path.exists``, ``Path.is_file``,
``glob``: the files a node has and this machine lacks), and no word of the simulation in its message.
"""
from __future__ import annotations

import ast
import functools
import os
import re
import sys
from typing import Callable, Optional

_KINDS = (ValueError, AssertionError, RuntimeError, TypeError, NotImplementedError)
_NOT_KINDS = (OSError, ImportError, LookupError, UnicodeError)
# calls that ask about files: a node has them, this machine may not
_FILE_PROBES = frozenset({"exists", "isfile", "isdir", "is_file", "is_dir", "glob", "iglob", "rglob", "listdir",
                          "scandir", "stat", "getsize", "access", "lexists", "walk", "open", "load", "read_text"})
# what a check of the launch talks about: the world, ranks, GPUs, nodes, parallel degrees, meshes
_ABOUT_THE_NODE = re.compile(r"world|rank|gpu|device_count|num_devices|nproc|\bnodes?\b|degree|divisib|mesh|"
                             r"data.parallel|tensor.parallel|pipeline.parallel|context.parallel|replicate|"
                             r"\b(dp|tp|pp|cp|ep|fsdp)(_\w+)?\b", re.I)
_SIMULATION_WORDS = ("meta", "cuda", "fake", "storage", "nccl", "download", "offline",
                     "not found", "no such", "missing", "does not exist", "doesn't exist", "empty")


# torch's own checks of a model or optimizer
_VALIDATING = ("nn", "optim")          # torch's sub-packages whose checks these are
_VALIDATION_ERRORS = (KeyError, TypeError, ValueError, IndexError)
# what the simulated node itself lacks, even where torch.nn raises it (meta tensors, devices)
_TORCH_SIMULATION_WORDS = ("meta", "device", "cuda", "fake", "storage")


def raised_by_model_validation(exc: BaseException) -> bool:
    """`exc` was raised by torch.nn's or torch.optim's own validation (``add_module("a.b", m)``,
    ``register_buffer`` with a taken name, an optimizer option out of range): the innermost frame is
    torch.nn/torch.optim code and the error is a validation error that does not come from the meta
    device or the simulated devices."""
    if not isinstance(exc, _VALIDATION_ERRORS) or isinstance(exc, ImportError):
        return False
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return False
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch, "__file__", None):
        return False
    fname = os.path.abspath(last.tb_frame.f_code.co_filename)
    root = os.path.dirname(os.path.abspath(torch.__file__))
    if not any(fname.startswith(os.path.join(root, sub) + os.sep) for sub in _VALIDATING):
        return False
    if os.path.basename(fname).startswith("parametriz"):
        return False        # a parametrized weight's value computed (`orthogonal` on meta has no base): no check
    text = str(exc).lower()
    return not any(word in text for word in _TORCH_SIMULATION_WORDS)



def raised_by_the_script(exc: BaseException, is_project_path: Callable[[str], bool]) -> bool:
    """Whether `exc` is the project's own refusal (see the module); the caller has ruled out stand-ins and
    consequences of skipped statements."""
    if not isinstance(exc, _KINDS) or isinstance(exc, _NOT_KINDS):
        return False
    tb, last = exc.__traceback__, None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None or exc.__cause__ is not None or exc.__context__ is not None:
        return False        # a failure translated into the project's words (`raise ValueError(...) from e`)
    path = os.path.abspath(last.tb_frame.f_code.co_filename)
    if not is_project_path(path):
        return False
    found = _statement_at(path, last.tb_lineno)
    if found is None:
        return False
    stmt, test = found
    if isinstance(stmt, ast.Assert) != isinstance(exc, AssertionError):
        return False        # the check's own test failed to evaluate (`names[0]` of a set): a bug, not a check
    if not _ABOUT_THE_NODE.search(f"{_source(test)} {exc}"):
        return False        # a check of something else (data, paths, arguments): what the node lacks may decide it
    if any(word in str(exc).lower() for word in _SIMULATION_WORDS):
        return False
    return test is None or not _probes_files(test)


def _source(node) -> str:
    try:
        return ast.unparse(node) if node is not None else ""
    except Exception:  # noqa: BLE001
        return ""


def _probes_files(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in _FILE_PROBES:
                return True
    return False


def is_raise_statement(path: str, line: int) -> bool:
    """Whether `line` of `path` is a ``raise`` statement of the file (with an exception)."""
    found = _statements(path).get(line)
    return found is not None and isinstance(found[0], ast.Raise)


def _statement_at(path: str, line: int):
    """(the raise/assert statement at `line`, the test that guards it: the assert's, or the innermost `if`
    around the raise), or None when `line` is not a raise/assert of the file."""
    return _statements(path).get(line)


@functools.lru_cache(maxsize=64)
def _statements(path: str) -> dict:
    try:
        with open(path, encoding="utf-8-sig") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    out: dict = {}

    def visit(node: ast.AST, test: Optional[ast.AST]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Assert):
                out[child.lineno] = (child, child.test)
            elif isinstance(child, ast.Raise) and child.exc is not None:
                out[child.lineno] = (child, test)
            elif isinstance(child, ast.If):
                visit(child, child.test)
            elif isinstance(child, ast.stmt):
                visit(child, None if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else test)

    visit(tree, None)
    return out


def fails_an_import(exc: BaseException, frame, is_project_path: Callable[[str], bool]) -> bool:
    """A statement at the top level of a project module that fails on a value of its own (``lr =
    float("2e-4x")``): importing the module fails there on a node too, and skipping it leaves what the module
    registers unset, which later code looks up with a default -- a plan of the defaults. A ValueError,
    TypeError or ArithmeticError only, raised in the module's own code or a function it called, with no word of
    the simulation; the caller rules out stand-ins and consequences of skipped statements."""
    if frame is None or not isinstance(exc, (ValueError, TypeError, ArithmeticError)):
        return False
    if isinstance(exc, _NOT_KINDS) or exc.__cause__ is not None or exc.__context__ is not None:
        return False
    # the innermost module body on the failure's way: the statement's own (a top-level statement), or a project
    # module imported under it (`importlib.import_module("exps.finetune")` in a loop of a function)
    tb, body = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "<module>" and is_project_path(os.path.abspath(tb.tb_frame.f_code.co_filename)):
            body = tb.tb_frame
        tb = tb.tb_next
    if body is None or body is not frame and not _imported_under(body, frame):
        return False
    text = str(exc).lower()
    return not any(word in text for word in _SIMULATION_WORDS + ("missing", "none"))


def _imported_under(body, frame) -> bool:
    """`body` (a module's top level) runs because `frame`'s statement imported it."""
    f = body.f_back
    while f is not None and f is not frame:
        f = f.f_back
    return f is frame and body is not frame and body.f_code.co_filename != frame.f_code.co_filename


def guard_skipped_before(skips, exc: BaseException):
    """The last skipped guard of the function `exc` failed in (a SkipRecord of `skips`): ``if not num_samples:
    raise RuntimeError(...)`` raised there itself (a `raise` statement of the project), skipped, and the
    function went on in the state it refused (``num_samples // world_size``)."""
    frames = set()
    tb = exc.__traceback__
    while tb is not None:
        frames.add(id(tb.tb_frame))
        tb = tb.tb_next
    for record in reversed(skips):
        if record.frame is None or id(record.frame) not in frames or record.exc is exc:
            continue
        last = record.exc.__traceback__
        while last is not None and last.tb_next is not None:
            last = last.tb_next
        if last is not None and last.tb_frame is record.frame and is_raise_statement(
                os.path.abspath(record.frame.f_code.co_filename), last.tb_lineno):
            return record
    return None


def stand_in_before(stub_uses, exc: BaseException):
    """A use of a stand-in (of `stub_uses`) earlier in the function `exc` failed in whose value the failing
    line reads: what it checks may be the stand-in's value (``num_shards = len(wds.expand_urls(...))``, then
    an assert on it)."""
    from fsdp_lint.replay.stand_ins import flows_into

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return None
    code = tb.tb_frame.f_code
    path = os.path.abspath(code.co_filename)
    return next((u for u in stub_uses if os.path.abspath(u.path) == path
                 and code.co_firstlineno <= u.line <= tb.tb_lineno and flows_into(path, u.line, tb.tb_lineno)), None)
