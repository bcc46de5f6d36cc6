"""`suggest`: plans a user can write instead of the file's, judged against the memory budget
(``--suggest``). ``search`` builds the candidates and their per-rank peak (the static estimate; with
activation checkpointing the forward is traced again with the blocks checkpointed); ``changes``
writes each change in the front-end the file uses (torch code, accelerate's YAML keys, the HF
Trainer's ``TrainingArguments``/``fsdp_config`` fields, Lightning's strategy arguments)."""
