"""fsdp_lint/check"""
