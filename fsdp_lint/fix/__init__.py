"""Fixes as data: the edits a rule's finding carries (`edits`), how rules compute them from the
user's source (`codemods`, libcst: formatting and comments kept), and how `--fix`/`--diff` apply
them after the report (`apply`). Produced with the findings (the rules' stage), applied by the CLI."""
