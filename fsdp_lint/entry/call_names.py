"""The names of the calls the source facts recognise: FSDP's wrap functions, auto-wrap policies, dtype casts,
optimizers, model factories and the frameworks that wrap on the script's behalf."""
from __future__ import annotations

WRAP_FSDP2 = {"fully_shard"}
WRAP_FSDP1 = {"FullyShardedDataParallel"}
POLICY_NAMES = {
    "transformer_auto_wrap_policy", "size_based_auto_wrap_policy", "lambda_auto_wrap_policy",
    "ModuleWrapPolicy", "CustomPolicy", "always_wrap_policy",
}
DTYPE_METHODS = {"half", "bfloat16", "float", "double"}
OPTIMIZER_NAMES = {
    "SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD", "LBFGS", "NAdam", "RAdam",
    "RMSprop", "Rprop", "SparseAdam", "Adafactor", "Muon", "Lion", "ZeroRedundancyOptimizer",
}
FACTORY_NAMES = ("build_model", "make_model", "create_model", "get_model")
# Hugging Face-style model factories: a file calling one builds a model
HF_FACTORIES = {"from_config", "from_pretrained", "_from_config"}
# frameworks that wrap with FSDP on the script's behalf (Lightning strategies, accelerate, the HF Trainer)
FRAMEWORK_MODULES = {"lightning", "pytorch_lightning", "lightning_fabric", "accelerate"}
FRAMEWORK_NAMES = {"TrainingArguments", "Seq2SeqTrainingArguments", "FullyShardedDataParallelPlugin",
                   "FSDPStrategy", "ModelParallelStrategy"}
