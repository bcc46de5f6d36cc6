"""FSD001 unused-noqa."""
import os

from fsdp_lint.check.rule import Example, Rule
from fsdp_lint.rules._granularity import _MODEL

_WRAPPED = _MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)
'''


class UnusedNoqa(Rule):
    """A `# noqa` names an fsdp-lint code that suppresses nothing, or a code no rule has.

    ## What it does
    ruff's RUF100 for fsdp-lint's codes: after the other rules ran on the file, reports each `FSDnnn`
    code (or prefix) in a `# noqa: ...` comment -- at the end of a line, or a file-level
    `# fsdp-lint: noqa: ...` -- that suppressed no finding, and each `FSD` code that matches no rule.
    Codes of other tools (`E501`, `F401`, `BLE001`) and bare `# noqa` comments (shared with
    other linters) are left alone, as are codes whose rules did not run on the file (deselected, or
    for the other FSDP API). The project's helper modules where the plan's calls and findings are
    (a `shard(model)` helper the entry calls) are judged with the entry.

    ## Why is this bad?
    A `# noqa` that suppresses nothing is left from a finding that was fixed, or sits on a line other
    than the one fsdp-lint reports (the wrap call): the next real finding of that code on that line
    is then hidden without anyone deciding so. An unknown code is a typo (`FSD31` for `FSD301`) that
    suppresses nothing at all.

    ## Example
    ```python
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)  # noqa: FSD301
    ```

    ## Fix
    Remove the code (the fix does, `--fix`); remove the comment when no code is left:
    ```python
    fully_shard(model)
    ```
    """

    code = "FSD001"
    name = "unused-noqa"
    severity = "info"
    summary = "a # noqa names an fsdp-lint code that suppressed nothing, or a code no rule has"
    # runs after the other rules, on what they suppressed (engine.check_rules)
    judges_noqa = True

    VALID = [
        Example(_WRAPPED + '''
fully_shard(model)
''', note="no noqa"),
        Example(_MODEL + '''
from torch.distributed.fsdp import fully_shard
model = Net()
for layer in model.layers:
    fully_shard(layer)  # noqa: FSD301 -- the trainer shards the root
''', note="the noqa suppresses the FSD301 on its line"),
        Example('''# fsdp-lint: noqa: FSD301
''' + _WRAPPED, note="a file-level noqa that suppresses FSD301"),
        Example(_WRAPPED + '''
fully_shard(model)  # noqa: E501, BLE001
''', note="other tools' codes"),
    ]
    INVALID = [
        Example(_WRAPPED + '''
fully_shard(model)  # noqa: FSD301
''', note="nothing to suppress: the root is wrapped"),
        Example(_WRAPPED + '''
fully_shard(model)  # noqa: FSD999
''', note="no rule has that code"),
        Example('''# fsdp-lint: noqa: FSD105
''' + _WRAPPED + '''
fully_shard(model)
''', note="a file-level noqa for a finding the file does not have"),
    ]

    def check(self, ctx):
        from fsdp_lint.check.rule import all_rules
        from fsdp_lint.entry.noqa import noqa_comments

        if ctx.facts is None or not getattr(ctx.facts, "text", None):
            return
        known = [r.code for r in all_rules()]
        for facts in [ctx.facts] + _helper_facts(ctx):
            yield from self._judge(ctx, facts, known, noqa_comments)

    def _judge(self, ctx, facts, known, noqa_comments):
        path = os.path.abspath(facts.path)
        for comment in noqa_comments(facts.text):
            codes = comment["codes"]
            if not codes:
                continue          # a bare noqa: other linters read it too
            for i, (code, col) in enumerate(codes):
                if not code.startswith("FSD") or self.code.startswith(code):
                    continue      # another tool's code; a prefix of FSD001 may suppress this rule itself
                rules = [k for k in known if k.startswith(code)]
                where = "this file" if comment["file"] else "this line"
                if not rules:
                    msg = f"unknown code `{code}` in `# noqa`: no fsdp-lint rule has that code or prefix"
                elif (path, comment["line"], code) in ctx.noqa_used or not any(k in ctx.rules_run for k in rules):
                    continue
                else:
                    shown = rules[0] if rules == [code] else f"{code} ({', '.join(rules)})"
                    msg = f"unused `# noqa` code `{code}`: no {shown} finding on {where} to suppress"
                yield self.finding(ctx, msg, line=comment["line"], col=col, path=facts.path,
                                   fix=f"remove `{code}` from the comment", code_in_noqa=code,
                                   fix_edits=_remove_code(facts, comment, i))


def _helper_facts(ctx) -> list:
    """The project's other Python modules where this plan's findings are attributed: the files of its
    units, policies, optimizers and wrap calls (a helper's `fully_shard(...)`), and of the findings the
    rules made; the noqa comments there are judged as the entry's are. Installed libraries are not."""
    from fsdp_lint.entry.project import facts_for, is_local
    from fsdp_lint.entry.source import SourceError

    plan = ctx.plan
    paths = set(ctx.finding_paths)
    for items in (getattr(plan, "units", None) or [], getattr(plan, "policies", None) or [],
                  getattr(plan, "optimizers", None) or []):
        paths.update(getattr(x, "path", None) or "" for x in items)
    for (site, _), (via, _) in (getattr(plan, "call_sites", None) or {}).items():
        paths.update((site, via))
    entry = os.path.abspath(ctx.facts.path)
    out = []
    for p in sorted({os.path.abspath(p) for p in paths if p and p.endswith(".py")} - {entry}):
        if not os.path.isfile(p) or not is_local(p):
            continue
        try:
            facts = facts_for(p)
        except (OSError, SourceError):
            continue
        if getattr(facts, "text", None):
            out.append(facts)
    return out


def _remove_code(facts, comment, i: int):
    """The code taken out of its comment, with its separator; the whole directive (and the spaces before
    it, or its line when it stands alone) when it is the only code and nothing follows it."""
    from fsdp_lint.fix.edits import SAFE, Edit, Fix

    lines = facts.text.splitlines(keepends=True)
    line_no = comment["line"]
    text = lines[line_no - 1].rstrip("\r\n")
    codes = comment["codes"]
    code, col = codes[i]
    end = col + len(code)
    if len(codes) > 1:
        if i + 1 < len(codes):
            start, stop = col, codes[i + 1][1]
        else:
            start, stop = codes[i - 1][1] + len(codes[i - 1][0]), end
        edit = Edit(facts.path, line_no, start, line_no, stop, "")
    elif text[end - 1:].strip():
        return None        # an explanation follows the code: which words go with it is not mechanical
    elif not text[:comment["col"] - 1].strip():
        edit = Edit(facts.path, line_no, 1, line_no + 1, 1, "")           # a comment line of its own
    else:
        start = len(text[:comment["col"] - 1].rstrip()) + 1
        edit = Edit(facts.path, line_no, start, line_no, end, "")
    return Fix(f"remove `{code}` from the `# noqa` comment", SAFE, [edit])
