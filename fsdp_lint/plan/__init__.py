"""fsdp_lint/plan"""
