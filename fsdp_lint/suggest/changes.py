"""The change that turns the file's plan into a candidate, in the front-end the file uses: code for
torch's own FSDP1/FSDP2 calls, the accelerate config's YAML keys, the HF Trainer's
``TrainingArguments``/``fsdp_config`` fields, Lightning's strategy (and ``Trainer``) arguments.

``expressible`` says which changes a front-end can write at all: the frameworks wrap by class
(``transformer_layer_cls_to_wrap``, ``auto_wrap_policy={...}``), checkpoint every block or none, and
pass one ``reshard_after_forward``/sharding strategy to every unit; what they cannot write is not
suggested to their users."""
from __future__ import annotations

from typing import List

_FRAMEWORKS = ("accelerate", "transformers", "lightning")


def front_end(plan) -> str:
    """"accelerate" | "transformers" | "lightning" | "fsdp1" | "fsdp2"."""
    framework = getattr(plan, "framework", None)
    return framework if framework in _FRAMEWORKS else (plan.api or "fsdp2")


def expressible(plan, tree):
    """`fn(axis, value, modules=(), blocks=())` for ``space.search_space``: whether the file's
    front-end can write it. For a granularity, `modules` are its units and `blocks` the blocks: a
    front-end that wraps by class can write it only when every instance of the classes of the
    other units is among them."""
    fe = front_end(plan)

    def by_class(modules: List[str], blocks: List[str]) -> bool:
        extra = [m for m in modules if m not in blocks]
        classes = {tree.modules[m].cls for m in extra}
        everywhere = [f for f, info in tree.modules.items() if f and info.cls in classes]
        return sorted(everywhere) == sorted(extra)

    def fn(axis: str, value, modules=(), blocks=()) -> bool:
        if axis == "granularity" and value == "tied-group":
            # several modules as one unit: FSDP2's ``fully_shard([emb, head])``; FSDP1 and the
            # frameworks' class policies cannot write it (a tied pair then stays in the root)
            return plan.api == "fsdp2" and (fe == "fsdp2" or fe == "lightning")
        if fe in ("fsdp1", "fsdp2") or (fe == "lightning" and plan.api == "fsdp2"):
            return True     # torch code (Lightning's ModelParallelStrategy: in configure_model)
        if axis == "granularity":
            if value == "blocks":
                return True
            return bool(modules) and by_class(list(modules), list(blocks))
        if axis == "ac":
            # the HF Trainer checkpoints every n-th decoder layer where the installed transformers has
            # ``activation_checkpointing_kwargs={"every_n_layers": n}`` (layers 0, n, 2n, ...);
            # Lightning's set and accelerate's bool checkpoint every block of the class
            return value == "full" or (fe == "transformers" and _hf_every_n_layers())
        if axis == "precision":
            return value == "bf16" or (fe == "lightning" and plan.api == "fsdp1")
        if axis == "reshard":
            return value == "none"
        if axis == "hsdp":
            return plan.api == "fsdp1"
        return True   # offload
    return fn


def _hf_every_n_layers() -> bool:
    """Whether the installed transformers' Trainer takes ``activation_checkpointing_kwargs`` with
    ``every_n_layers`` (its ``activation_checkpointing_enable(every_n_layers=...)``)."""
    import inspect
    import sys

    if "transformers" not in sys.modules:
        return False
    try:
        from transformers import PreTrainedModel, TrainingArguments
    except Exception:
        return False
    enable = getattr(PreTrainedModel, "activation_checkpointing_enable", None)
    fields = getattr(TrainingArguments, "__dataclass_fields__", {})
    return enable is not None and "every_n_layers" in inspect.signature(enable).parameters and \
        "activation_checkpointing_kwargs" in fields


def describe(kinds: List[str], plan, tree, details: dict) -> str:
    """The change to make for `kinds` (``space.Choice.kinds``); `details`: the modules it names
    (``blocks``, ``extra`` units, ``checkpointed`` blocks, ``last`` block, ``node``, ``replicas``)."""
    if not kinds:
        return "keep the plan as it is"
    fe = front_end(plan)
    ctx = _Context(plan, tree, details)
    parts = []
    kinds = list(kinds)
    # FSDP1 has one sharding strategy: HSDP of a plan that does not reshard after forward (the
    # candidate's, or the file's SHARD_GRAD_OP) is _HYBRID_SHARD_ZERO2, as the candidate's plan is
    zero2 = "no-reshard" in kinds or (plan.sharding_strategy or "") == "SHARD_GRAD_OP"
    if plan.api == "fsdp1" and "hsdp" in kinds and zero2:
        kinds = [k for k in kinds if k not in ("no-reshard", "hsdp")] + ["hsdp-zero2"]
    for k in kinds:
        parts.append({"accelerate": _accelerate, "transformers": _transformers, "lightning": _lightning,
                      "fsdp1": _fsdp1, "fsdp2": _fsdp2}[fe](k, ctx))
    return "; ".join(_one_plugin_call(parts))


def _one_plugin_call(parts: List[str]) -> List[str]:
    """The arguments of several ``FullyShardedDataParallelPlugin(...)`` changes in one call."""
    head = "`FullyShardedDataParallelPlugin("
    args = [p[len(head):-2] for p in parts if p.startswith(head)]
    if len(args) < 2:
        return parts
    first = next(i for i, p in enumerate(parts) if p.startswith(head))
    rest = [p for p in parts if not p.startswith(head)]
    return rest[:first] + [head + ", ".join(args) + ")`"] + rest[first:]


class _Context:
    def __init__(self, plan, tree, details: dict):
        self.plan, self.tree, self.d = plan, tree, details
        blocks = details.get("blocks") or []
        self.block_classes = sorted({tree.modules[b].cls for b in blocks}) or ["Block"]
        self.block = self.block_classes[0] if len(self.block_classes) == 1 else \
            "(" + ", ".join(self.block_classes) + ")"
        parents = {b.rpartition(".")[0] for b in blocks}
        self.stack = tree.expr(parents.pop()) if len(parents) == 1 else None
        self.extra = details.get("extra") or []
        self.extra_classes = sorted({tree.modules[m].cls for e in self.extra for m in _modules(e)})

    def expr(self, fqn) -> str:
        """`model.a` for a module, `[model.a, model.b]` for modules sharded as one group."""
        if isinstance(fqn, str):
            return self.tree.expr(fqn)
        return "[" + ", ".join(self.tree.expr(m) for m in fqn) + "]"

    def for_blocks(self, call: str) -> str:
        if self.stack:
            return f"`for block in {self.stack}: {call.format(m='block')}`"
        return f"`{call.format(m='block')}` for every `{self.block}`"

    def classes(self, with_extra: bool) -> List[str]:
        return self.block_classes + (self.extra_classes if with_extra else [])


def _modules(entry) -> tuple:
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _selective(ctx: _Context) -> str:
    if ctx.stack:
        return f"set(list({ctx.stack})[::2])"
    return "{" + ", ".join(ctx.expr(b) for b in ctx.d.get("checkpointed") or []) + "}"


def _torch_ac(kind: str, ctx: _Context) -> str:
    check = f"isinstance(m, {ctx.block})" if kind == "ac-full" else f"m in {_selective(ctx)}"
    what = "every block" if kind == "ac-full" else "every second block"
    return (f"checkpoint {what}: `apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper, "
            f"check_fn=lambda m: {check})` before the wrap calls")


def _fsdp2(kind: str, ctx: _Context) -> str:
    if kind == "wrap-blocks":
        return "one unit per block: " + ctx.for_blocks("fully_shard({m})") + " before `fully_shard(model)`"
    if kind in ("wrap-embeddings-head", "wrap-experts"):
        calls = ", ".join(f"`fully_shard({ctx.expr(m)})`" for m in ctx.extra[:4]) + (
            f" (and {len(ctx.extra) - 4} more)" if len(ctx.extra) > 4 else "")
        where = "before their blocks" if kind == "wrap-experts" else "before `fully_shard(model)`"
        blocks = "" if ctx.d.get("file_per_block") else "; " + ctx.for_blocks("fully_shard({m})")
        return f"units of their own: {calls} {where}{blocks}"
    if kind in ("ac-full", "ac-selective"):
        return _torch_ac(kind, ctx)
    if kind in ("bf16", "bf16-fp32-reduce"):
        reduce = "bfloat16" if kind == "bf16" else "float32"
        return (f"`mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.{reduce})` "
                f"on every `fully_shard` call")
    if kind == "root-reshard":
        return "`fully_shard(model, reshard_after_forward=True)` for the root"
    if kind == "last-block-no-reshard":
        return f"`fully_shard({ctx.expr(ctx.d['last'])}, reshard_after_forward=False)` for the last block"
    if kind == "no-reshard":
        return "`reshard_after_forward=False` on every block's `fully_shard` call"
    if kind == "reshard-to-node":
        return (f"`reshard_after_forward={ctx.d['node']}` on every block's `fully_shard` call (reshard to "
                f"the {ctx.d['node']} GPUs of a node)")
    if kind == "hsdp":
        return (f"`mesh=init_device_mesh(\"cuda\", ({ctx.d['replicas']}, {ctx.d['node']}), "
                f"mesh_dim_names=(\"replicate\", \"shard\"))` on every `fully_shard` call (HSDP)")
    return "`offload_policy=CPUOffloadPolicy()` on every `fully_shard` call"


def _fsdp1_policy(ctx: _Context, with_extra: bool) -> str:
    if with_extra and ctx.extra:
        named = " or ".join(f"m is {ctx.expr(m)}" for m in ctx.extra[:4])
        if len(ctx.extra) > 4 or not named:
            named = f"isinstance(m, {ctx.extra_classes[0]})" if len(ctx.extra_classes) == 1 else \
                "isinstance(m, (" + ", ".join(ctx.extra_classes) + "))"
        return (f"`auto_wrap_policy=functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: "
                f"isinstance(m, {ctx.block}) or {named})`")
    return "`auto_wrap_policy=ModuleWrapPolicy({" + ", ".join(ctx.block_classes) + "})`"


def _fsdp1(kind: str, ctx: _Context) -> str:
    if kind == "wrap-blocks":
        return "one unit per block: " + _fsdp1_policy(ctx, False)
    if kind in ("wrap-embeddings-head", "wrap-experts"):
        return "units of their own: " + _fsdp1_policy(ctx, True)
    if kind in ("ac-full", "ac-selective"):
        return _torch_ac(kind, ctx)
    if kind in ("bf16", "bf16-fp32-reduce"):
        reduce = "bfloat16" if kind == "bf16" else "float32"
        return f"`FSDP(..., mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.{reduce}))`"
    if kind == "no-reshard":
        return "`FSDP(..., sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)`"
    if kind == "hsdp":
        return (f"`FSDP(..., sharding_strategy=ShardingStrategy.HYBRID_SHARD)` (shards within a node of "
                f"{ctx.d['node']} GPUs, {ctx.d['replicas']} replicas)")
    if kind == "hsdp-zero2":
        return (f"`FSDP(..., sharding_strategy=ShardingStrategy._HYBRID_SHARD_ZERO2)` (shards within a node of "
                f"{ctx.d['node']} GPUs, {ctx.d['replicas']} replicas)")
    return "`FSDP(..., cpu_offload=CPUOffload(offload_params=True))`"


def _accelerate(kind: str, ctx: _Context) -> str:
    if getattr(ctx.plan, "framework_config", None) == "plugin":
        return _accelerate_plugin(kind, ctx)
    key = "accelerate config: `fsdp_config: {{{}}}`".format
    if kind == "wrap-blocks":
        return key("fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP, fsdp_transformer_layer_cls_to_wrap: "
                   + ",".join(ctx.classes(False)))
    if kind in ("wrap-embeddings-head", "wrap-experts"):
        return key("fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP, fsdp_transformer_layer_cls_to_wrap: "
                   + ",".join(ctx.classes(True)))
    if kind == "ac-full":
        return key("fsdp_activation_checkpointing: true")
    if kind == "bf16":
        return "accelerate config: `mixed_precision: bf16`"
    if kind == "no-reshard":
        return key("fsdp_reshard_after_forward: false") if ctx.plan.api == "fsdp2" else \
            key("fsdp_sharding_strategy: SHARD_GRAD_OP")
    if kind in ("hsdp", "hsdp-zero2"):
        return key("fsdp_sharding_strategy: " + ("HYBRID_SHARD" if kind == "hsdp" else "HYBRID_SHARD_ZERO2"))
    return key("fsdp_offload_params: true")


def _accelerate_plugin(kind: str, ctx: _Context) -> str:
    """accelerate's ``FullyShardedDataParallelPlugin(...)`` passed to ``Accelerator(fsdp_plugin=...)``:
    its own argument names. FSDP1's sharding strategy is ``sharding_strategy``: accelerate 1.x passes
    ``sharding_strategy or reshard_after_forward`` to FSDP1 and fills ``sharding_strategy`` with
    ``FULL_SHARD`` when it is not given, so ``reshard_after_forward`` alone would change nothing."""
    arg = "`FullyShardedDataParallelPlugin({})`".format
    if kind in ("wrap-blocks", "wrap-embeddings-head", "wrap-experts"):
        names = ", ".join(f'"{c}"' for c in ctx.classes(kind != "wrap-blocks"))
        return arg(f'auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=[{names}]')
    if kind == "ac-full":
        return arg("activation_checkpointing=True")
    if kind == "bf16":
        return '`Accelerator(mixed_precision="bf16")`'
    if kind == "no-reshard":
        return arg("reshard_after_forward=False" if ctx.plan.api == "fsdp2" else 'sharding_strategy="SHARD_GRAD_OP"')
    if kind in ("hsdp", "hsdp-zero2"):
        return arg('sharding_strategy="{}"'.format("HYBRID_SHARD" if kind == "hsdp" else "HYBRID_SHARD_ZERO2"))
    return arg("cpu_offload=True")


def _literal(ctx: _Context, value: bool) -> str:
    """A boolean inside ``fsdp_config``: Python's in ``TrainingArguments(...)``, JSON's in a file or
    on the command line (``plan.hf_frontend``)."""
    how = (getattr(ctx.plan, "hf_frontend", None) or {}).get("how", "python")
    return ("True" if value else "False") if how == "python" else ("true" if value else "false")


def _transformers(kind: str, ctx: _Context) -> str:
    if kind == "wrap-blocks":
        return "`fsdp_config={\"transformer_layer_cls_to_wrap\": [" + ", ".join(
            f'"{c}"' for c in ctx.classes(False)) + "]}`"
    if kind in ("wrap-embeddings-head", "wrap-experts"):
        return "`fsdp_config={\"transformer_layer_cls_to_wrap\": [" + ", ".join(
            f'"{c}"' for c in ctx.classes(True)) + "]}`"
    if kind == "ac-full":
        flag = "activation_checkpointing" if _hf_every_n_layers() else "gradient_checkpointing"
        return (f"`TrainingArguments({flag}=True)` (or `fsdp_config={{\"activation_checkpointing\": "
                + _literal(ctx, True) + "}`)")
    if kind == "ac-selective":
        return ("checkpoint every second decoder layer: `TrainingArguments(activation_checkpointing=True, "
                "activation_checkpointing_kwargs={\"every_n_layers\": 2})`")
    if kind == "bf16":
        return "`TrainingArguments(bf16=True)`"
    if kind == "no-reshard":
        return "`fsdp_config={\"reshard_after_forward\": " + _literal(ctx, False) + "}`" if ctx.plan.api == "fsdp2" else \
            "`TrainingArguments(fsdp=\"shard_grad_op auto_wrap\")`"
    if kind in ("hsdp", "hsdp-zero2"):
        return "`TrainingArguments(fsdp=\"{} auto_wrap\")`".format("hybrid_shard" if kind == "hsdp" else "hybrid_shard_zero2")
    return "`TrainingArguments(fsdp=\"full_shard offload auto_wrap\")`"


def _lightning(kind: str, ctx: _Context) -> str:
    if ctx.plan.api == "fsdp2":   # ModelParallelStrategy: the file's own fully_shard calls in configure_model
        return _fsdp2(kind, ctx) + " in `configure_model`"
    if kind == "wrap-blocks":
        return "`FSDPStrategy(auto_wrap_policy={" + ", ".join(ctx.classes(False)) + "})`"
    if kind in ("wrap-embeddings-head", "wrap-experts"):
        return "`FSDPStrategy(auto_wrap_policy={" + ", ".join(ctx.classes(True)) + "})`"
    if kind == "ac-full":
        return "`FSDPStrategy(activation_checkpointing_policy={" + ", ".join(ctx.block_classes) + "})`"
    if kind == "bf16":
        return "`Trainer(precision=\"bf16-mixed\")`"
    if kind == "bf16-fp32-reduce":
        return ("`FSDPStrategy(mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, "
                "reduce_dtype=torch.float32))`")
    if kind == "no-reshard":
        return "`FSDPStrategy(sharding_strategy=\"SHARD_GRAD_OP\")`"
    if kind in ("hsdp", "hsdp-zero2"):
        strategy = "HYBRID_SHARD" if kind == "hsdp" else "_HYBRID_SHARD_ZERO2"
        return (f"`FSDPStrategy(sharding_strategy=\"{strategy}\", device_mesh=({ctx.d['replicas']}, "
                f"{ctx.d['node']}))`")
    return "`FSDPStrategy(cpu_offload=True)`"
