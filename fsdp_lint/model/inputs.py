"""Synthetic inputs for a training step (``example_inputs()``, ``--input-shape``, or the first layer)
and the loss a step backpropagates."""
from __future__ import annotations


from fsdp_lint.model.unwrap import class_name, resolve_module, user_root


def find_example_inputs(namespace, model):
    if isinstance(namespace, dict) and callable(namespace.get("example_inputs")):
        return namespace["example_inputs"]
    for cls in type(user_root(model)).__mro__:
        for attr in ("forward", "__init__"):
            fn = cls.__dict__.get(attr)
            glob = getattr(fn, "__globals__", None)
            if isinstance(glob, dict) and callable(glob.get("example_inputs")) \
                    and not glob.get("__name__", "").startswith(("torch", "fsdp_lint")):
                return glob["example_inputs"]
    return None


_DTYPES = {"float": "float32", "long": "int64", "bfloat16": "bfloat16", "half": "float16"}


def make_inputs(spec, model, device, rank: int, step: int, example_fn):
    """(args, kwargs, description) for one step; raises InputError when nothing fits. A language
    model that computes its own loss (Hugging Face ``*ForCausalLM``, ``*LMHeadModel``,
    ``*ForMaskedLM``, ``*ForConditionalGeneration`` with a ``labels`` argument) is given its token ids as
    labels too."""
    import torch

    torch.manual_seed(10_007 * (rank + 1) + step)     # different data on every rank and step
    args, kwargs, how = _synthetic(spec, model, device, example_fn)
    if (example_fn is None or spec["input_shape"]) and _takes_labels(model) and args and isinstance(args[0], torch.Tensor) \
            and not args[0].is_floating_point() and "labels" not in kwargs:
        kwargs = dict(kwargs, labels=args[0])
        how += ", labels = the token ids"
    return args, kwargs, how


def _takes_labels(model) -> bool:
    import inspect

    root = user_root(model)
    # seq2seq models (T5, BART: *ForConditionalGeneration) derive their decoder inputs from the labels
    if not any(k in type(root).__name__ for k in ("CausalLM", "LMHead", "MaskedLM", "ConditionalGeneration")):
        return False
    try:
        return "labels" in inspect.signature(root.forward).parameters
    except (TypeError, ValueError):
        return False


def _synthetic(spec, model, device, example_fn):
    import torch

    if example_fn is not None and not spec["input_shape"]:     # --input-shape wins over the file
        value = example_fn()
        args, kwargs = _as_call(value)
        moved = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
        return [moved(a) for a in args], {k: moved(v) for k, v in kwargs.items()}, "example_inputs()"
    first = _first_layer(model, spec["params"])
    float_dtype = _float_dtype(first if first is not None and any(
        p.is_floating_point() for p in first.parameters(recurse=False)) else model)
    if spec["input_shape"]:
        shape = spec["input_shape"]
        # token ids for a model that starts with an embedding, unless --input-dtype says otherwise
        default = "long" if isinstance(first, torch.nn.Embedding) else "float"
        dtype = getattr(torch, _DTYPES[spec["input_dtype"] or default])
        if not dtype.is_floating_point:
            emb = next((m for m in user_root(model).modules() if isinstance(m, torch.nn.Embedding)), None)
            high = emb.num_embeddings if emb is not None else 2
            t = torch.randint(0, high, shape, device=device, dtype=dtype)
        else:
            t = torch.randn(shape, device=device, dtype=dtype)
        return [t], {}, f"--input-shape {','.join(map(str, shape))} ({str(dtype).replace('torch.', '')})"
    nn = torch.nn
    if spec["input_dtype"] and first is not None and not isinstance(first, nn.Embedding):
        float_dtype = getattr(torch, _DTYPES[spec["input_dtype"]])
    b, s = 2, 16
    if isinstance(first, nn.Embedding):
        t = torch.randint(0, first.num_embeddings, (b, s), device=device)
        return [t], {}, f"token ids [{b}, {s}] < {first.num_embeddings} (first layer: Embedding)"
    if isinstance(first, nn.Linear):
        t = torch.randn(b, s, first.in_features, device=device, dtype=float_dtype)
        return [t], {}, f"float [{b}, {s}, {first.in_features}] (first layer: Linear)"
    if isinstance(first, nn.MultiheadAttention):
        t = torch.randn(b, s, first.embed_dim, device=device, dtype=float_dtype)
        return [t], {}, f"float [{b}, {s}, {first.embed_dim}] (first layer: MultiheadAttention)"
    norm_types = tuple(c for c in (nn.LayerNorm, getattr(nn, "RMSNorm", None)) if c is not None)
    if isinstance(first, norm_types) and first.normalized_shape:
        dims = tuple(first.normalized_shape)
        t = torch.randn(b, s, *dims, device=device, dtype=float_dtype)
        return [t], {}, f"float [{b}, {s}, {', '.join(map(str, dims))}] (first layer: {type(first).__name__})"
    for conv, spatial in ((nn.Conv1d, (64,)), (nn.Conv2d, (32, 32)), (nn.Conv3d, (16, 16, 16))):
        if isinstance(first, conv):
            t = torch.randn(b, first.in_channels, *spatial, device=device, dtype=float_dtype)
            return [t], {}, f"float [{b}, {first.in_channels}, {', '.join(map(str, spatial))}] (first layer: {conv.__name__})"
    what = type(first).__name__ if first is not None else "no layer with parameters"
    raise InputError(
        f"cannot infer inputs for {class_name(model)} (first layer: {what}); pass "
        f"--input-shape D0,D1,... (with --input-dtype long for token ids) or define example_inputs() "
        f"in the model file")


class InputError(Exception):
    pass


def _as_call(value):
    if isinstance(value, dict):
        return [], dict(value)
    if isinstance(value, (tuple, list)):
        return list(value), {}
    return [value], {}


def _float_dtype(model):
    import torch

    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _first_layer(model, params=()):
    """The first leaf module (no children) that holds parameters, in definition order: read from
    the static tree's parameter order (FSDP1 unregisters the parameters it flattens)."""
    for fqn in params:
        m = resolve_module(model, fqn.rpartition(".")[0])
        if m is not None and not any(True for _ in m.children()):
            return m
    for m in user_root(model).modules():
        name = type(m).__name__
        if name.startswith("FullyShardedDataParallel") or list(m.children()):
            continue
        if any(True for _ in m.parameters(recurse=False)) or hasattr(m, "_fsdp_wrapped_module"):
            return m
        # FSDP1 replaced the registered parameters: still a layer of a known kind
        import torch.nn as nn

        if isinstance(m, (nn.Embedding, nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.LayerNorm)):
            return m
    return None


def loss_of(output):
    """The scalar a step backpropagates: the model's own loss when it computes one, else the mean
    of its (first floating) output."""
    import torch

    if output is None:
        return None
    if isinstance(getattr(output, "loss", None), torch.Tensor):
        output = output.loss            # the model's own loss (Hugging Face, given labels)
    elif hasattr(output, "logits") and isinstance(getattr(output, "logits"), torch.Tensor):
        output = output.logits
    elif isinstance(output, dict):
        output = output.get("loss", output.get("logits", next((v for v in output.values()
                                                                if isinstance(v, torch.Tensor)), None)))
    elif isinstance(output, (tuple, list)):
        output = next((v for v in output if isinstance(v, torch.Tensor)), None)
    if not isinstance(output, torch.Tensor):
        return None
    if not output.is_floating_point():
        return None
    return output.float().mean()
