"""The fsdp-lint rule catalogue: one module per rule (see ``fsdp_lint.check.rule.Rule``)."""
