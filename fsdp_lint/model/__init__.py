"""fsdp_lint/model"""
