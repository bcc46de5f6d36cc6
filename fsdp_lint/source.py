"""`source`: what the file's code says, read with libcst and never executed.

SourceFacts tell the later stages where the wrap calls, freezing statements, dtype changes and
optimizer constructions are, which statements (and which functions, transitively) matter for the
wrap plan, and which loops are training/data loops that the replay must never run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

WRAP_FSDP2 = {"fully_shard"}
WRAP_FSDP1 = {"FullyShardedDataParallel"}
POLICY_NAMES = {
    "transformer_auto_wrap_policy", "size_based_auto_wrap_policy", "lambda_auto_wrap_policy",
    "ModuleWrapPolicy", "CustomPolicy", "always_wrap_policy",
}
DTYPE_METHODS = {"half", "bfloat16", "float", "double"}
OPTIMIZER_NAMES = {
    "SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "LBFGS", "NAdam", "RAdam",
    "RMSprop", "Rprop", "SparseAdam", "Adafactor", "Muon", "Lion", "ZeroRedundancyOptimizer",
}
FACTORY_NAMES = ("build_model", "make_model", "create_model", "get_model")

# cheap pre-check, no parsing and no torch: does the file define or wrap a model at all?
_INTERESTING = re.compile(
    r"\b(nn\.Module|torch\.nn|fully_shard|FullyShardedDataParallel|FSDP|Module\)|from_config|from_pretrained"
    # frameworks that wrap the model with FSDP themselves (issue 8)
    r"|Fabric|Trainer|Accelerator|FSDPStrategy|ModelParallelStrategy|TrainingArguments)\b"
)


class SourceError(Exception):
    """The file cannot be read or parsed (message is one line)."""


def looks_relevant(text: str) -> bool:
    return bool(_INTERESTING.search(text))


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
    line: int
    end_line: int
    params: List[str]
    defaults: int                 # number of trailing parameters with defaults
    is_method: bool
    direct_markers: Set[str] = field(default_factory=set)   # kinds of sites in its own body
    calls: Set[str] = field(default_factory=set)            # simple names it calls
    relevant: bool = False        # transitively contains a wrap/freeze/dtype/optimizer site
    wraps: bool = False           # transitively contains a wrap call


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

    @property
    def wrap_sites(self) -> List[Site]:
        return [s for s in self.sites if s.kind in ("fsdp1", "fsdp2")]

    @property
    def uses_fsdp(self) -> bool:
        return bool(self.wrap_sites)

    @property
    def uses_framework(self) -> bool:
        """The file hands a model to a framework that wraps it (``trainer.fit``, ``accelerator.prepare``)."""
        return any(s.kind == "framework" for s in self.sites)

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

    _module_calls: Set[str] = field(default_factory=set)
    framework_imports: Set[str] = field(default_factory=set)   # top-level framework packages imported (issue 8)


_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]*(?:\s*,\s*[A-Z]+[0-9]*)*))?", re.IGNORECASE)


def _noqa_lines(text: str) -> Dict[int, Optional[Set[str]]]:
    out: Dict[int, Optional[Set[str]]] = {}
    if "noqa" not in text:
        return out
    for i, line in enumerate(text.splitlines(), start=1):
        m = _NOQA.search(line)
        if m:
            codes = m.group("codes")
            out[i] = None if not codes else {c.strip().upper() for c in codes.split(",")}
    return out


def read_source(path: str) -> SourceFacts:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read {path}: {exc}") from None
    return parse_source(path, text)


def parse_source(path: str, text: str) -> SourceFacts:
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        try:  # Python's own message and line are clearer ("expected ':'") than libcst's
            compile(text, path, "exec", dont_inherit=True)
        except SyntaxError as py_exc:
            raise SourceError(f"{path}:{py_exc.lineno}:{py_exc.offset or 1}: syntax error: {py_exc.msg}") from None
        except Exception:
            pass
        msg = str(exc).strip().splitlines()[0]
        raise SourceError(f"{path}:{exc.raw_line}:{exc.raw_column + 1}: syntax error: {msg}") from None
    except Exception as exc:  # libcst raises a few other types on odd input
        raise SourceError(f"{path}: cannot parse: {exc}") from None
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    collector = _Collector()
    collector.positions = wrapper.resolve(PositionProvider)
    module.visit(collector)

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

    # relevance: a function is relevant when it (transitively) holds a site
    changed = True
    for f in functions.values():
        f.relevant = bool(f.direct_markers)
        f.wraps = bool(f.direct_markers & {"fsdp1", "fsdp2"})
    while changed:
        changed = False
        for f in functions.values():
            for callee in f.calls:
                g = functions.get(callee)
                if g is None or g is f:
                    continue
                if g.relevant and not f.relevant:
                    f.relevant = changed = True
                if g.wraps and not f.wraps:
                    f.wraps = changed = True
    relevant_fn_names = {n for n, f in functions.items() if f.relevant}
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
        main_guard_line=collector.main_guard_line,
    )
    facts._module_calls = module_calls
    facts.framework_imports = collector.framework_imports
    return facts


def _dotted(node) -> str:
    import libcst as cst

    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr.value}" if base else node.attr.value
    if isinstance(node, cst.Call):
        return _dotted(node.func) + "()"
    if isinstance(node, cst.Subscript):
        return _dotted(node.value) + "[]"
    return ""


def _expr_text(node) -> str:
    import libcst as cst

    try:
        return cst.Module(body=[]).code_for_node(node)
    except Exception:
        return _dotted(node)


def _collector_base():
    import libcst as cst

    return cst.CSTVisitor


class _Collector(_collector_base()):  # type: ignore[misc]
    """One pass over the module: sites, functions, statement markers, loops."""

    def __init__(self):
        super().__init__()
        self.positions = {}
        self.sites: List[Site] = []
        self.functions: Dict[str, FunctionFacts] = {}
        self.module_classes: List[Tuple[str, int]] = []
        self.aliases: Dict[str, str] = {}
        self.stmt_markers: Dict[int, Tuple[Set[str], Set[str]]] = {}
        self.loop_lines: Set[int] = set()
        self.training_loop_lines: Set[int] = set()
        # ("mark", kind, open statement lines, function, open loop lines, site index) and
        # ("call", callee name, ...) in source order; relevance is decided after the pass
        self.events: List[Tuple[str, str, Tuple[int, ...], Optional[FunctionFacts], Tuple[int, ...], int]] = []
        self.main_guard_line: Optional[int] = None
        self.frameworks: Set[str] = set()           # frameworks the file imports (issue 8)
        self.framework_imports: Set[str] = set()    # ... as top-level packages
        self._stmt_stack: List[List[int]] = [[]]   # per function scope: open statement lines
        self._fn_stack: List[FunctionFacts] = []
        self._class_depth = 0
        self._loop_stack: List[int] = []

    # -- helpers ---------------------------------------------------------------------------
    def _pos(self, node) -> Tuple[int, int]:
        pos = self.positions.get(node)
        if pos is None:
            return (0, 0)
        return (pos.start.line, pos.start.column + 1)

    def _mark(self, kind: str, name: str, node) -> None:
        line, col = self._pos(node)
        fn = self._fn_stack[-1].name if self._fn_stack else None
        self.sites.append(Site(kind=kind, name=name, line=line, col=col, function=fn))
        self.events.append(("mark", kind, tuple(self._stmt_stack[-1]),
                            self._fn_stack[-1] if self._fn_stack else None, tuple(self._loop_stack),
                            len(self.sites) - 1))

    def _call(self, name: str) -> None:
        fn = self._fn_stack[-1] if self._fn_stack else None
        self.events.append(("call", name, tuple(self._stmt_stack[-1]), fn, tuple(self._loop_stack), -1))

    def _canonical(self, dotted: str) -> str:
        last = dotted.rsplit(".", 1)[-1]
        if "." not in dotted and dotted in self.aliases:
            return self.aliases[dotted]
        return last

    # -- statements --------------------------------------------------------------------------
    def _open(self, node) -> None:
        line, _ = self._pos(node)
        self._stmt_stack[-1].append(line)
        self.stmt_markers.setdefault(line, (set(), set()))

    def _close(self, node) -> None:
        self._stmt_stack[-1].pop()

    def visit_SimpleStatementLine(self, node):
        self._open(node)

    def leave_SimpleStatementLine(self, node):
        self._close(node)

    def _visit_compound(self, node):
        self._open(node)

    def _leave_compound(self, node):
        self._close(node)

    def visit_If(self, node):
        import libcst as cst

        self._open(node)
        test = node.test
        if (not self._fn_stack and isinstance(test, cst.Comparison) and _dotted(test.left) == "__name__"):
            self.main_guard_line = self._pos(node)[0]

    leave_If = _leave_compound
    visit_With = _visit_compound
    leave_With = _leave_compound
    visit_Try = _visit_compound
    leave_Try = _leave_compound

    def _visit_loop(self, node):
        import libcst as cst

        self._open(node)
        line = self._pos(node)[0]
        self.loop_lines.add(line)
        self._loop_stack.append(line)
        # a loop over a data loader / epochs, or one that steps an optimizer (see visit_Call), is
        # a training loop; a `while` only when its condition talks about steps, epochs or data
        # (``while step < max_steps``); other `while` loops before the wrap never run anyway, and
        # the ones in model code (``while dim % 8: dim += 1``) must
        words = ("loader", "dataset", "batch", "epoch", "data", "step", "iter")
        if isinstance(node, cst.While):
            text = _expr_text(node.test).lower()
            if any(w in text for w in words):
                self.training_loop_lines.add(line)
        else:
            it = _dotted(node.iter).lower()
            if any(w in it for w in words[:5]):
                self.training_loop_lines.add(line)

    def _leave_loop(self, node):
        self._loop_stack.pop()
        self._close(node)

    visit_For = _visit_loop
    leave_For = _leave_loop
    visit_While = _visit_loop
    leave_While = _leave_loop

    def visit_FunctionDef(self, node):
        import libcst as cst

        line = self._pos(node)[0]
        end = self.positions[node].end.line if node in self.positions else line
        params = [p.name.value for p in list(node.params.posonly_params) + list(node.params.params)]
        defaults = sum(1 for p in list(node.params.posonly_params) + list(node.params.params) if p.default is not None)
        is_method = self._class_depth > 0 and not self._fn_stack
        if is_method and params and params[0] in ("self", "cls"):
            params = params[1:]
        f = FunctionFacts(name=node.name.value, line=line, end_line=end, params=params,
                          defaults=defaults, is_method=is_method)
        # keep the first definition of a name; methods do not shadow module functions
        if f.name not in self.functions or (self.functions[f.name].is_method and not is_method):
            self.functions[f.name] = f
        self._fn_stack.append(f)
        self._stmt_stack.append([])
        self._saved_loops = getattr(self, "_saved_loops", [])
        self._saved_loops.append(self._loop_stack)
        self._loop_stack = []
        del cst

    def leave_FunctionDef(self, node):
        self._fn_stack.pop()
        self._stmt_stack.pop()
        self._loop_stack = self._saved_loops.pop()

    def visit_Lambda(self, node):
        # a lambda's body runs where it is called (e.g. inside a policy), not where it is written
        return True

    def visit_ClassDef(self, node):
        bases = [_dotted(b.value) for b in node.bases]
        if any(b.split(".")[-1] in ("Module", "PreTrainedModel") or b.endswith("nn.Module") for b in bases) or any(
            b in {c for c, _ in self.module_classes} for b in bases
        ):
            self.module_classes.append((node.name.value, self._pos(node)[0]))
        self._class_depth += 1

    def leave_ClassDef(self, node):
        self._class_depth -= 1

    # -- imports -----------------------------------------------------------------------------
    def visit_Import(self, node):
        for alias in node.names:
            self._framework_import(_dotted(alias.name))

    def _framework_import(self, module: str) -> None:
        from fsdp_lint.frameworks.detect import imported_framework

        framework = imported_framework(module)
        if framework:
            self.frameworks.add(framework)
            self.framework_imports.add(module.split(".")[0])

    def visit_ImportFrom(self, node):
        import libcst as cst

        if not node.relative and node.module is not None:
            self._framework_import(_dotted(node.module))
        if isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            name = _dotted(alias.name)
            local = alias.asname.name.value if alias.asname else name
            if name in WRAP_FSDP1 | WRAP_FSDP2 | POLICY_NAMES | OPTIMIZER_NAMES or name in ("MixedPrecisionPolicy", "MixedPrecision"):
                self.aliases[local] = name

    # -- expressions -------------------------------------------------------------------------
    def visit_Call(self, node):
        dotted = _dotted(node.func)
        if not dotted:
            return
        name = self._canonical(dotted)
        last = dotted.rsplit(".", 1)[-1]
        if name in WRAP_FSDP2:
            self._mark("fsdp2", dotted, node)
        elif name in WRAP_FSDP1 or dotted == "FSDP":
            self._mark("fsdp1", dotted, node)
        elif name in POLICY_NAMES:
            self._mark("policy", dotted, node)
        elif last == "requires_grad_":
            self._mark("freeze", dotted, node)
        elif last in DTYPE_METHODS and not node.args and "." in dotted:
            self._mark("dtype", dotted, node)
        elif last == "to" and "." in dotted and any(
            (a.keyword is not None and a.keyword.value == "dtype") or "16" in _dotted(a.value) or "float" in _dotted(a.value)
            for a in node.args
        ):
            self._mark("dtype", dotted, node)
        elif self._is_optimizer(dotted, name):
            self._mark("optimizer", dotted, node)
        elif self._framework_call(dotted):
            self._mark("framework", dotted, node)
        if last in ("backward", "step", "zero_grad") and self._loop_stack:
            self.training_loop_lines.update(self._loop_stack)
        self._call(last)
        # functions handed to launchers count as called: mp.spawn(main, ...), fire.Fire(main)
        import libcst as cst

        for arg in node.args:
            if isinstance(arg.value, cst.Name):
                self._call(arg.value.value)

    def _framework_call(self, dotted: str) -> bool:
        from fsdp_lint.frameworks.detect import framework_call

        return framework_call(dotted, self.frameworks) is not None

    def _is_optimizer(self, dotted: str, name: str) -> bool:
        parts = dotted.split(".")
        if name in OPTIMIZER_NAMES and (len(parts) == 1 and dotted in self.aliases or "optim" in parts[:-1]):
            return True
        if name in OPTIMIZER_NAMES and len(parts) > 1 and "optim" in dotted:
            return True
        lowered = parts[-1].lower()
        return lowered.endswith("optimizer") and lowered.startswith(("build", "create", "make", "get", "configure", "init", "setup"))

    def visit_AssignTarget(self, node):
        import libcst as cst

        target = node.target
        if isinstance(target, cst.Attribute) and target.attr.value == "requires_grad":
            self._mark("freeze", _dotted(target), node)

    def visit_Assign(self, node):
        """``shard = functools.partial(fully_shard, mesh=mesh)`` / ``wrap = partial(FSDP, ...)``:
        calling the name wraps, like the API itself."""
        import libcst as cst

        value = node.value
        if not isinstance(value, cst.Call) or not value.args:
            return
        if _dotted(value.func).rsplit(".", 1)[-1] != "partial":
            return
        first = _dotted(value.args[0].value)
        if not first:
            return
        name = self._canonical(first)
        if name not in WRAP_FSDP1 | WRAP_FSDP2 and first != "FSDP":
            return
        canonical = "FullyShardedDataParallel" if first == "FSDP" else name
        for target in node.targets:
            if isinstance(target.target, cst.Name):
                self.aliases[target.target.value] = canonical
