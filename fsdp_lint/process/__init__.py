"""fsdp_lint/process"""
