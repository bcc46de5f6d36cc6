"""`source`: what a module's code says, read from its syntax tree and never executed.

SourceFacts tell the later stages where the wrap calls, freezing statements, dtype changes and
optimizer constructions are, which statements (and which functions, transitively) matter for the
wrap plan, which loops are training/data loops that the replay must never run, and what the module
imports (``fsdp_lint.entry.project`` follows the project-local ones).

The syntax tree is Python's own (``ast``): the replay reads every project-local module a training
script imports, and ``ast`` parses a few thousand lines in milliseconds where a concrete syntax tree
takes a second.
"""
from __future__ import annotations

from fsdp_lint.entry.launch_calls import names_a_launcher, starts_a_launch
from fsdp_lint.entry.noqa import _noqa_lines, file_noqa_lines
from fsdp_lint.entry.reading import SourceError, python_requirement_note, read_text  # noqa: F401 - (callers' names)
from fsdp_lint.entry.relevance import (  # noqa: F401 - (callers' names)
    called_here, calls_through_keywords, mark_relevance, relevant_lines_with, stores_into)

import ast
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from fsdp_lint.entry.call_names import (  # noqa: F401 - (callers' names)
    DTYPE_METHODS, FACTORY_NAMES, FRAMEWORK_MODULES, FRAMEWORK_NAMES, HF_FACTORIES, OPTIMIZER_NAMES, POLICY_NAMES,
    WRAP_FSDP1, WRAP_FSDP2)


# a loop over these (``for file in data_files``, ``for name in data_args.dataset_names``) builds the data
# set mixture -- setup that runs (each load stands in here) -- not a loop over the data itself
_DATA_SOURCES = frozenset({"files", "file", "paths", "path", "dirs", "dir", "names", "name", "configs", "config",
                           "sources", "source", "specs", "mixture", "mix", "args", "splits"})

@dataclass
class Site:
    kind: str            # "fsdp1" | "fsdp2" | "freeze" | "dtype" | "optimizer" | "policy"
    name: str            # the callee as written, e.g. "FSDP", "fully_shard", "torch.optim.AdamW"
    line: int
    col: int
    function: Optional[str]  # enclosing function name, None at module level


@dataclass
class FunctionFacts:
    name: str
    line: int                     # the `def` line
    end_line: int
    params: List[str]
    defaults: int                 # number of trailing parameters with defaults
    is_method: bool
    first_line: int = 0           # first line of the definition, decorators included (co_firstlineno)
    cls: Optional[str] = None     # the class of a method
    direct_markers: Set[str] = field(default_factory=set)   # kinds of sites in its own body
    calls: Set[str] = field(default_factory=set)            # simple names it calls
    relevant: bool = False        # transitively contains a wrap/freeze/dtype/optimizer site
    wraps: bool = False           # transitively contains a wrap call
    stores_into_params: bool = False   # writes into an object it is given (`cfg["vocab_size"] = ...`, `args.x = ...`)


@dataclass
class ImportInfo:
    module: str                   # "torch.nn", "helpers" ("" for ``from . import x``)
    level: int                    # relative import level (0: absolute)
    names: List[str]              # imported names (``from m import a, b``); [] for ``import m``
    line: int
    top_level: bool               # a statement of the module body (not in a function, class or try)


@dataclass
class SourceFacts:
    path: str
    text: str
    sites: List[Site]
    functions: Dict[str, FunctionFacts]
    module_classes: List[Tuple[str, int]]      # (class name, line) of classes that look like nn.Modules
    relevant_stmt_lines: Set[int]             # start lines of statements that affect the wrap plan
    dropped_loop_lines: Set[int]              # start lines of training/data loops never to run
    aliases: Dict[str, str]                   # local name -> canonical API name ("FullyShardedDataParallel", ...)
    noqa: Dict[int, Optional[Set[str]]]       # line -> codes (None = all)
    main_guard_line: Optional[int] = None
    imports: List[ImportInfo] = field(default_factory=list)
    classes: Dict[str, List[str]] = field(default_factory=dict)   # class name -> base names as written
    calls_hf_factory: bool = False            # calls from_config/from_pretrained
    uses_framework: bool = False              # imports Lightning/accelerate, names an HF FSDP argument class, or
                                              # hands the model to a framework (``trainer.fit``, ``accelerator.prepare``)
    framework_imports: Set[str] = field(default_factory=set)   # top-level framework packages it imports
    future_annotations: bool = False
    # line -> codes a file-level `# fsdp-lint: noqa[: CODES]` there suppresses anywhere in it (None = all)
    noqa_file: Dict[int, Optional[Set[str]]] = field(default_factory=dict)

    @property
    def wrap_sites(self) -> List[Site]:
        return [s for s in self.sites if s.kind in ("fsdp1", "fsdp2")]

    @property
    def uses_fsdp(self) -> bool:
        return bool(self.wrap_sites)

    @property
    def api(self) -> Optional[str]:
        kinds = {s.kind for s in self.wrap_sites}
        if kinds == {"fsdp1"}:
            return "fsdp1"
        if kinds == {"fsdp2"}:
            return "fsdp2"
        return None

    def sites_of(self, kind: str) -> List[Site]:
        return [s for s in self.sites if s.kind == kind]

    def factories(self) -> List[str]:
        return [n for n in FACTORY_NAMES if n in self.functions and self.functions[n].defaults == len(self.functions[n].params)]

    def uncalled_wrap_helpers(self) -> List[FunctionFacts]:
        """Functions that wrap a model but that no code in the file calls (library-style files)."""
        called: Set[str] = set()
        for f in self.functions.values():
            called |= f.calls
        called |= self._module_calls
        return [f for f in self.functions.values() if f.wraps and f.name not in called and not f.is_method]

    def take_tree(self):
        """The parsed module, once (the transform changes it); later callers parse again."""
        tree = self.__dict__.pop("_tree", None)
        return tree if tree is not None else parse_tree(self.path, self.text)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_tree", None)
        return state

    @property
    def defines_model(self) -> bool:
        return bool(self.module_classes) or bool(self.factories()) or self.calls_hf_factory

    _module_calls: Set[str] = field(default_factory=set)
    _stmt_calls: Dict[int, Set[str]] = field(default_factory=dict)   # statement line -> names it calls
    loop_calls: Dict[int, Set[str]] = field(default_factory=dict)     # loop line -> names called inside it
    # of the dropped loops, those that step: they call backward()/step()/zero_grad() (training itself)
    stepping_loop_lines: Set[int] = field(default_factory=set)


# a framework's object by its class: the word `entry.detect` knows its calls by (`accelerator.prepare(...)`)
_FRAMEWORK_OBJECTS = {"Accelerator": "accelerator", "Fabric": "fabric", "Trainer": "trainer", "SFTTrainer": "trainer",
                      "DPOTrainer": "trainer", "GRPOTrainer": "trainer", "Seq2SeqTrainer": "trainer"}


def read_source(path: str) -> SourceFacts:
    return parse_source(path, read_text(path))


def parse_tree(path: str, text: str) -> ast.Module:
    try:
        return ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise SourceError(f"{path}:{exc.lineno or 1}:{exc.offset or 1}: syntax error: {exc.msg}"
                          f"{python_requirement_note(path)}") from None
    except (ValueError, MemoryError, RecursionError) as exc:   # NUL bytes, absurd nesting
        raise SourceError(f"{path}: cannot parse: {exc}") from None


def parse_source(path: str, text: str) -> SourceFacts:
    module = parse_tree(path, text)
    collector = _Collector()
    collector.visit(module)

    # training/data loops are never replayed, unless they wrap something; what happens inside them
    # (``logits.float()``, ``optimizer.step()``, a call of ``train_step``) does not affect the plan
    wrap_loops = {loop for ev in collector.events if ev[0] == "mark" and ev[1] in ("fsdp1", "fsdp2")
                  for loop in ev[4]}
    dropped = {line for line in collector.training_loop_lines if line not in wrap_loops}
    live_sites = set()
    functions = collector.functions
    stmt_markers: Dict[int, Tuple[Set[str], Set[str]]] = {}
    module_calls: Set[str] = set()
    for what, value, stmt_lines, fn, loops, site_index in collector.events:
        if dropped.intersection(loops):
            continue
        for line in stmt_lines:
            stmt_markers.setdefault(line, (set(), set()))[0 if what == "mark" else 1].add(value)
        if what == "mark":
            live_sites.add(site_index)
            if fn is not None:
                fn.direct_markers.add(value)
        elif fn is not None:
            fn.calls.add(value)
        else:
            module_calls.add(value)

    calls_through_keywords(collector.keyword_bindings, functions.values(), module_calls,
                           (calls for _, calls in stmt_markers.values()))
    mark_relevance(functions)
    relevant_fn_names = {f.name for f in functions.values() if f.relevant}
    relevant_lines: Set[int] = set()
    for line, (markers, calls) in stmt_markers.items():
        if markers or (calls & relevant_fn_names):
            relevant_lines.add(line)
    sites = [site for i, site in enumerate(collector.sites) if i in live_sites]
    facts = SourceFacts(
        path=path,
        text=text,
        sites=sites,
        functions=functions,
        module_classes=collector.module_classes,
        relevant_stmt_lines=relevant_lines,
        dropped_loop_lines=dropped,
        aliases=collector.aliases,
        noqa=_noqa_lines(text),
        noqa_file=file_noqa_lines(text),
        main_guard_line=collector.main_guard_line,
        imports=collector.imports,
        classes=collector.classes,
        calls_hf_factory=collector.calls_hf_factory,
        uses_framework=collector.uses_framework or any(site.kind == "framework" for site in collector.sites),
        framework_imports=collector.framework_imports,
        future_annotations=collector.future_annotations,
    )
    facts._module_calls = module_calls
    facts.keyword_bindings = collector.keyword_bindings
    facts.stepping_loop_lines = collector.stepping_loop_lines & dropped
    facts._stmt_calls = {line: calls for line, (_, calls) in stmt_markers.items() if calls}
    for what, value, _, _, loops, _ in collector.events:
        if what == "call":
            for loop in loops:
                facts.loop_calls.setdefault(loop, set()).add(value)
    return facts


def _nn_container(base: str) -> bool:
    """``nn.Sequential``/``nn.ModuleList``/``nn.ModuleDict`` as a base: a model built as a container
    (``class Tower(nn.Sequential)``) is an nn.Module."""
    parts = base.split(".")
    return len(parts) >= 2 and parts[-2] == "nn" and parts[-1] in ("Sequential", "ModuleList", "ModuleDict")


def dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    if isinstance(node, ast.Call):
        return dotted(node.func) + "()"
    if isinstance(node, ast.Subscript):
        return dotted(node.value) + "[]"
    return ""


def _expr_text(node) -> str:
    return ast.unparse(node)


_COMPOUND = (ast.If, ast.With, ast.AsyncWith, ast.Try, ast.For, ast.AsyncFor, ast.While) + (
    (ast.TryStar,) if hasattr(ast, "TryStar") else ()) + ((ast.Match,) if hasattr(ast, "Match") else ())
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


class _Collector(ast.NodeVisitor):
    """One pass over the module: sites, functions, statement markers, loops, imports."""

    def __init__(self):
        self.sites: List[Site] = []
        self.functions: Dict[str, FunctionFacts] = {}
        self.module_classes: List[Tuple[str, int]] = []
        self.classes: Dict[str, List[str]] = {}
        self.aliases: Dict[str, str] = {}
        self.renamed: Dict[str, str] = {}           # `from m import train as train_fn`: train_fn -> train
        self.imports: List[ImportInfo] = []
        self.training_loop_lines: Set[int] = set()
        self.stepping_loop_lines: Set[int] = set()
        # ("mark", kind, open statement lines, function, open loop lines, site index) and
        # ("call", callee name, ...) in source order; relevance is decided after the pass
        self.events: List[Tuple[str, str, Tuple[int, ...], Optional[FunctionFacts], Tuple[int, ...], int]] = []
        self.main_guard_line: Optional[int] = None
        self.calls_hf_factory = False
        self.uses_framework = False
        self.frameworks: Set[str] = set()           # frameworks the module imports (frameworks.detect)
        self.receiver_words: Dict[str, str] = {}    # names bound to a framework's object -> the word it goes by
        self.framework_imports: Set[str] = set()    # ... as top-level packages
        self.future_annotations = False
        self._stmt_stack: List[List[int]] = [[]]   # per function scope: open statement lines
        self._fn_stack: List[FunctionFacts] = []
        self._class_depth = 0
        self._class_stack: List[str] = []
        self._try_depth = 0
        self._loop_stack: List[int] = []
        self.launcher_names: Set[str] = set()      # `cmd = ["torchrun", ...]`: a launch command (entry.launch_calls)
        self.stdlib_names: Set[str] = set()        # names of standard-library modules imported (`import os`)
        self.instances: Dict[str, str] = {}        # name -> the class it is an instance of (`core = Trainer(...)`)
        self.keyword_bindings: Dict[str, Set[str]] = {}     # keyword -> the functions passed as it

    # -- helpers ---------------------------------------------------------------------------
    def _mark(self, kind: str, name: str, node) -> None:
        fn = self._fn_stack[-1].name if self._fn_stack else None
        self.sites.append(Site(kind=kind, name=name, line=node.lineno, col=node.col_offset + 1, function=fn))
        self.events.append(("mark", kind, tuple(self._stmt_stack[-1]),
                            self._fn_stack[-1] if self._fn_stack else None, tuple(self._loop_stack),
                            len(self.sites) - 1))

    def _call(self, name: str, bare: bool = False) -> None:
        fn = self._fn_stack[-1] if self._fn_stack else None
        self.events.append(("call", name, tuple(self._stmt_stack[-1]), fn, tuple(self._loop_stack), -1))
        if bare and name in self.renamed:    # a call through an import's new name calls the function it names
            self.events.append(("call", self.renamed[name], tuple(self._stmt_stack[-1]), fn,
                                tuple(self._loop_stack), -1))

    def _canonical(self, name: str) -> str:
        last = name.rsplit(".", 1)[-1]
        if "." not in name and name in self.aliases:
            return self.aliases[name]
        return last

    # -- statements --------------------------------------------------------------------------
    def visit(self, node):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self._stmt_stack[-1].append(node.lineno)
            try:
                return super().visit(node)
            finally:
                self._stmt_stack[-1].pop()
        return super().visit(node)

    def visit_If(self, node):
        test = node.test
        if not self._fn_stack and not self._class_depth and isinstance(test, ast.Compare) \
                and dotted(test.left) == "__name__":
            self.main_guard_line = node.lineno
        self.generic_visit(node)

    def _visit_try(self, node):
        # statements under a `try` with handlers are the file's own error handling
        self.visit_list(node.body, in_try=bool(node.handlers))
        for h in node.handlers:
            self.visit(h)
        self.visit_list(node.orelse)
        self.visit_list(node.finalbody)

    visit_Try = _visit_try
    visit_TryStar = _visit_try

    def visit_list(self, stmts, in_try: bool = False):
        self._try_depth += in_try
        try:
            for s in stmts:
                self.visit(s)
        finally:
            self._try_depth -= in_try

    def _visit_loop(self, node):
        line = node.lineno
        self._loop_stack.append(line)
        # a loop over a data loader / epochs, or one that steps an optimizer (see visit_Call), is
        # a training loop; a `while` only when its condition talks about steps, epochs or data
        # (``while step < max_steps``); other `while` loops before the wrap never run anyway, and
        # the ones in model code (``while dim % 8: dim += 1``) must
        words = ("loader", "dataset", "batch", "epoch", "data", "step", "iter")
        if isinstance(node, ast.While):
            text = _expr_text(node.test).lower()
            if any(w in text for w in words):
                self.training_loop_lines.add(line)
        else:
            # the whole expression: `enumerate(tqdm(self.train_dataloader))`, `range(start_epoch, epochs)`
            it = _expr_text(node.iter).lower()
            # (a config section's entries, `cfg.datasource.items()`, are settings, not data)
            if any(w in it for w in ("loader", "batch", "epoch")) or (
                    any(w in it for w in ("dataset", "data")) and not _DATA_SOURCES & set(re.split(r"[^a-z0-9]+", it))
                    and not re.search(r"\.(items|keys|values)\(\)$", it)):
                self.training_loop_lines.add(line)
        try:
            self.generic_visit(node)
        finally:
            self._loop_stack.pop()

    visit_For = _visit_loop
    visit_AsyncFor = _visit_loop
    visit_While = _visit_loop

    def visit_FunctionDef(self, node):
        args = node.args
        positional = list(args.posonlyargs) + list(args.args)
        params = [a.arg for a in positional]
        defaults = len(args.defaults)
        is_method = self._class_depth > 0 and not self._fn_stack
        if is_method and params and params[0] in ("self", "cls"):
            params = params[1:]
            defaults = min(defaults, len(params))
        first = min([d.lineno for d in node.decorator_list] + [node.lineno])
        f = FunctionFacts(name=node.name, line=node.lineno, end_line=node.end_lineno or node.lineno, params=params,
                          defaults=defaults, is_method=is_method, first_line=first,
                          cls=self._class_stack[-1] if is_method else None,
                          stores_into_params=stores_into(node, set(params)))
        # the first definition of a name under the name (methods do not shadow module functions), another under
        # its class and line, so that its body is read too (two classes' `__init__` in one module)
        if f.name in self.functions and not (self.functions[f.name].is_method and not is_method):
            self.functions[f"{f.cls}.{f.name}@{f.line}"] = f
        else:
            if f.name in self.functions:
                shadowed = self.functions[f.name]
                self.functions[f"{shadowed.cls}.{shadowed.name}@{shadowed.line}"] = shadowed
            self.functions[f.name] = f
        for d in node.decorator_list:
            self.visit(d)
        for d in list(args.defaults) + [d for d in args.kw_defaults if d is not None]:
            self.visit(d)
        self._fn_stack.append(f)
        self._stmt_stack.append([])
        saved_loops, self._loop_stack = self._loop_stack, []
        saved_try, self._try_depth = self._try_depth, 0
        saved_class, self._class_depth = self._class_depth, 0
        try:
            for s in node.body:
                self.visit(s)
        finally:
            self._fn_stack.pop()
            self._stmt_stack.pop()
            self._loop_stack = saved_loops
            self._try_depth = saved_try
            self._class_depth = saved_class

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        bases = [dotted(b) for b in node.bases]
        self.classes.setdefault(node.name, bases)
        if any(b.split(".")[-1] in ("Module", "PreTrainedModel") or b.endswith("nn.Module") or _nn_container(b)
               for b in bases) or any(
            b in {c for c, _ in self.module_classes} for b in bases
        ):
            self.module_classes.append((node.name, node.lineno))
        for d in node.decorator_list + node.bases + [k.value for k in node.keywords]:
            self.visit(d)
        self._class_depth += 1
        self._class_stack.append(node.name)
        try:
            for s in node.body:
                self.visit(s)
        finally:
            self._class_depth -= 1
            self._class_stack.pop()

    # -- imports -----------------------------------------------------------------------------
    def _top_level(self) -> bool:
        return not self._fn_stack and not self._class_depth and not self._try_depth

    def _framework_import(self, module: str) -> None:
        from fsdp_lint.entry.detect import imported_framework

        framework = imported_framework(module)
        if framework:
            self.frameworks.add(framework)
            self.framework_imports.add(module.split(".")[0])

    def visit_Import(self, node):
        for alias in node.names:
            self.imports.append(ImportInfo(alias.name, 0, [], node.lineno, self._top_level()))
            if alias.name.split(".")[0] in sys.stdlib_module_names:     # `os.environ.get(...)` is no project method
                self.stdlib_names.add(alias.asname or alias.name.split(".")[0])
            self._framework_import(alias.name)
            if alias.name.split(".")[0] in FRAMEWORK_MODULES:
                self.uses_framework = True

    def visit_ImportFrom(self, node):
        module = node.module or ""
        if module == "__future__":
            self.future_annotations |= any(a.name == "annotations" for a in node.names)
        names = [a.name for a in node.names]
        self.imports.append(ImportInfo(module, node.level or 0, names, node.lineno, self._top_level()))
        if not node.level and module:
            self._framework_import(module)
        if module.split(".")[0] in FRAMEWORK_MODULES or FRAMEWORK_NAMES.intersection(names):
            self.uses_framework = True
        for alias in node.names:
            if alias.name == "*":
                continue
            name = alias.name
            local = alias.asname or name
            if local != name:
                self.renamed[local] = name
            if name in WRAP_FSDP1 | WRAP_FSDP2 | POLICY_NAMES | OPTIMIZER_NAMES or name in ("MixedPrecisionPolicy", "MixedPrecision"):
                self.aliases[local] = name

    # -- expressions -------------------------------------------------------------------------
    def visit_Lambda(self, node):
        # a lambda's body runs where it is called (e.g. inside a policy), not where it is written:
        # its calls count for the statement that holds it
        self.generic_visit(node)

    def visit_Call(self, node):
        name_as_written = dotted(node.func)
        if name_as_written:
            self._classify_call(node, name_as_written)
        self.generic_visit(node)

    def _classify_call(self, node, written: str) -> None:
        name = self._canonical(written)
        last = written.rsplit(".", 1)[-1]
        if name in WRAP_FSDP2:
            self._mark("fsdp2", written, node)
        elif name in WRAP_FSDP1 or written == "FSDP":
            self._mark("fsdp1", written, node)
        elif name in POLICY_NAMES:
            self._mark("policy", written, node)
        elif last == "requires_grad_":
            self._mark("freeze", written, node)
        elif last in DTYPE_METHODS and not node.args and "." in written:
            self._mark("dtype", written, node)
        elif last == "to" and "." in written and any(
            "16" in dotted(a) or "float" in dotted(a) for a in node.args
        ) or last == "to" and "." in written and any(k.arg == "dtype" for k in node.keywords):
            self._mark("dtype", written, node)
        elif self._is_optimizer(written, name):
            self._mark("optimizer", written, node)
        elif self.frameworks and self._framework_call(written):
            self._mark("framework", written, node)
        elif starts_a_launch(node, written, self.launcher_names):     # the model is built in what it starts
            self.events.append(("mark", "launch", tuple(self._stmt_stack[-1]), self._fn_stack[-1] if self._fn_stack
                                else None, tuple(self._loop_stack), -1))
        if last in HF_FACTORIES:
            self.calls_hf_factory = True
        if last in FRAMEWORK_NAMES:
            self.uses_framework = True
        if last in ("backward", "step", "zero_grad") and self._loop_stack:
            self.training_loop_lines.update(self._loop_stack)
            self.stepping_loop_lines.update(self._loop_stack)
        if written.split(".")[0] not in self.stdlib_names:
            self._call(last, bare="." not in written)
        if written in self.instances:        # `core = Trainer(...); core()`: that class's __call__ runs
            self._call(f"__call__@{self.instances[written]}")
        for k in node.keywords:              # `TrainSpec(parallelize_fn=parallelize)`: `spec.parallelize_fn(m)` calls it
            if k.arg and isinstance(k.value, ast.Name):
                self.keyword_bindings.setdefault(k.arg, set()).add(k.value.id)
        # functions handed to launchers count as called: mp.spawn(main, ...), fire.Fire(main)
        for arg in list(node.args) + [k.value for k in node.keywords]:
            if isinstance(arg, ast.Starred):
                arg = arg.value
            if isinstance(arg, ast.Name):
                self._call(arg.id, bare=True)

    def _framework_call(self, written: str) -> bool:
        from fsdp_lint.entry.detect import framework_call

        root, dot, rest = written.partition(".")
        if dot and root in self.receiver_words:
            written = f"{self.receiver_words[root]}.{rest}"
        return framework_call(written, self.frameworks) is not None

    def _is_optimizer(self, written: str, name: str) -> bool:
        parts = written.split(".")
        if name in OPTIMIZER_NAMES and (len(parts) == 1 and written in self.aliases or "optim" in parts[:-1]):
            return True
        if name in OPTIMIZER_NAMES and len(parts) > 1 and "optim" in written:
            return True
        lowered = parts[-1].lower()
        return lowered.endswith("optimizer") and lowered.startswith(("build", "create", "make", "get", "configure", "init", "setup"))

    def _visit_targets(self, targets) -> None:
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr == "requires_grad":
                self._mark("freeze", dotted(target), target)

    def visit_Assign(self, node):
        self._visit_targets(node.targets)
        self._partial_alias(node)
        # `acc = Accelerator(...)`: `acc.prepare(model)` is the framework's call whatever the name says
        word = _FRAMEWORK_OBJECTS.get(dotted(node.value.func).rsplit(".", 1)[-1]) if isinstance(node.value, ast.Call) else None
        if word:
            self.receiver_words.update({t.id: word for t in node.targets if isinstance(t, ast.Name)})
        if names_a_launcher(node.value):
            self.launcher_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        made = dotted(node.value.func).rsplit(".", 1)[-1] if isinstance(node.value, ast.Call) else ""
        if made[:1].isupper():
            self.instances.update({t.id: made for t in node.targets if isinstance(t, ast.Name)})
        self.generic_visit(node)

    def visit_AnnAssign(self, node):
        self._visit_targets([node.target])
        self.generic_visit(node)

    def _partial_alias(self, node) -> None:
        """``shard = functools.partial(fully_shard, mesh=mesh)`` / ``wrap = partial(FSDP, ...)``:
        calling the name wraps, like the API itself."""
        value = node.value
        if not isinstance(value, ast.Call) or not value.args:
            return
        if dotted(value.func).rsplit(".", 1)[-1] != "partial":
            return
        first = dotted(value.args[0])
        if not first:
            return
        name = self._canonical(first)
        if name not in WRAP_FSDP1 | WRAP_FSDP2 and first != "FSDP":
            return
        canonical = "FullyShardedDataParallel" if first == "FSDP" else name
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.aliases[target.id] = canonical
