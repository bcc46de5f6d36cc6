"""fsdp_lint/entry"""
