"""The replay's code transform never breaks valid Python.

It is applied to the linted file and to every project-local module the file imports, so it must
accept any valid module -- ``from __future__`` imports, decorators, ``match``, async code, class
bodies, ``global``/``nonlocal`` -- and, where nothing fails, leave what the code computes unchanged.
"""
from __future__ import annotations

import glob
import os
import textwrap
from concurrent.futures import ProcessPoolExecutor

import pytest

from fsdp_lint.replay.transform import CAUGHT, SETUP_DONE, SKIP, SKIPPABLE, STUB_IMPORT, transform
from fsdp_lint.entry.source import parse_source


def _transform_files(paths):
    """(files transformed, [(path, error)]) for every file Python itself compiles."""
    from fsdp_lint.entry.source import SourceError

    done, failures = 0, []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            facts = parse_source(path, text)
        except (SourceError, UnicodeDecodeError):
            continue            # not valid Python 3.x source for this interpreter: nothing to keep
        try:
            transform(facts, main=True)
            done += 1
        except Exception as exc:   # noqa: BLE001 - every failure is reported
            try:
                compile(text, path, "exec", dont_inherit=True)
            except SyntaxError:
                continue        # parses, but Python itself rejects it (return outside a function...)
            failures.append((path, f"{type(exc).__name__}: {exc}"))
    return done, failures


def test_every_module_of_torch_and_transformers_transforms_and_compiles():
    import torch
    import transformers

    paths = []
    for pkg in (torch, transformers):
        paths += sorted(glob.glob(os.path.join(os.path.dirname(pkg.__file__), "**", "*.py"), recursive=True))
    workers = max(1, min(8, os.cpu_count() or 1))
    chunks = [paths[i::workers * 4] for i in range(workers * 4)]
    with ProcessPoolExecutor(workers) as pool:
        results = list(pool.map(_transform_files, chunks))
    done = sum(d for d, _ in results)
    failures = [f for _, fs in results for f in fs]
    assert done > 4000
    assert failures == [], failures[:5]


def _run_both(source: str, tmp_path, name="mod.py"):
    """The module's globals run as written and run through the transform (entry-file mode)."""
    text = textwrap.dedent(source)
    path = str(tmp_path / name)
    with open(path, "w") as fh:
        fh.write(text)
    plain: dict = {"__name__": "__main__"}
    exec(compile(text, path, "exec", dont_inherit=True), plain)
    code = transform(parse_source(path, text), main=True).code
    transformed: dict = {"__name__": "__main__", SKIP: lambda line, exc: False, SKIPPABLE: Exception,
                         SETUP_DONE: lambda: None, CAUGHT: lambda: None,
                         STUB_IMPORT: lambda *a: False, "__fsdp_lint_rebind__": lambda g: None,
                         "__fsdp_lint_training_loop__": lambda line: None}
    exec(code, transformed)
    return plain["RESULT"], transformed["RESULT"]


CASES = {
    "future-annotations": '''
        """A docstring first, then the future import."""
        from __future__ import annotations

        def f(x: SomeUndefinedType) -> list[int]:
            return [x]

        RESULT = f(3) + [f.__annotations__["x"]]
    ''',
    "generators-try-finally": '''
        log = []

        def gen(n):
            try:
                for i in range(n):
                    yield i * i
            finally:
                log.append("closed")

        RESULT = (list(gen(4)), log)
    ''',
    "own-exception-flow": '''
        class Missing(Exception):
            pass

        def load(name):
            if name == "x":
                raise Missing(name)
            return name.upper()

        def safe(name):
            try:
                value = load(name)
            except Missing:
                value = "default"
            return value

        RESULT = [safe("a"), safe("x")]
    ''',
    "scopes": '''
        counter = 0

        def bump():
            global counter
            counter += 1

        def outer():
            total = 0
            def add(k):
                nonlocal total
                total += k
            for k in (1, 2, 3):
                add(k)
            return total

        bump(); bump()
        RESULT = (counter, outer(), [y for y in range(3) if (z := y * 2) > 1], z)
    ''',
    "classes-super-decorators": '''
        import functools

        def twice(fn):
            @functools.wraps(fn)
            def inner(*a):
                return 2 * fn(*a)
            return inner

        class Base:
            def value(self):
                return 10

        class Child(Base):
            scale = 3
            items = [i * scale for i in range(2)] if False else [1, 2]

            @twice
            def value(self):
                return super().value() + len(self.items)

        RESULT = (Child().value(), Child.__qualname__, Child.value.__name__)
    ''',
    "match-and-async": '''
        import asyncio

        def kind(x):
            match x:
                case {"layers": n}:
                    return f"layers {n}"
                case [first, *rest]:
                    return f"list {first} {len(rest)}"
                case _:
                    return "other"

        async def twice(x):
            await asyncio.sleep(0)
            return x * 2

        RESULT = ([kind({"layers": 2}), kind([1, 2, 3]), kind(5)], asyncio.run(twice(21)))
    ''',
    "loops-else-break": '''
        found = None
        for i in range(10):
            if i * i > 20:
                found = i
                break
        else:
            found = -1
        n = 0
        while n < 5:
            n += 2
        RESULT = (found, n)
    ''',
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_transform_keeps_what_valid_code_computes(name, tmp_path):
    plain, transformed = _run_both(CASES[name], tmp_path)
    assert transformed == plain
