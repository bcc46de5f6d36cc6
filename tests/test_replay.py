"""The replay is safe: it runs a training script's setup code only up to the wrap, simulated.

A linted file is someone's training script. Linting it must never train, save checkpoints, join a real
process group, read fsdp-lint's own command line, print into fsdp-lint's output or leave torch,
``os.environ`` or ``sys.argv`` patched -- neither when the wrap is recorded on the meta device nor
when it is replayed with the real FSDP APIs (``real=True``), nor when the file fails.
"""
from __future__ import annotations

import argparse
import builtins
import json
import os
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from fsdp_lint.config import Settings
from fsdp_lint.engine import LintError, analyse
from fsdp_lint.replay import ReplayError, replay
from fsdp_lint.entry.source import read_source

# a training script with every hazard: it writes before the wrap, saves a checkpoint, has a training
# loop that writes and raises, code after the loop and after main() that raises, and it prints
SCRIPT = '''
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
print("PRINTED-AT-IMPORT")


def layers_from_cache():
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cache.txt"), "w") as f:
            f.write("3")
    except OSError:
        pass
    return 3


N_LAYERS = layers_from_cache()


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return self.fc(x)


class Net(nn.Module):
    def __init__(self, n_layers=N_LAYERS, d=8):
        super().__init__()
        print("PRINTED-IN-CONSTRUCTOR", file=sys.stderr)
        self.layers = nn.ModuleList(Block(d) for _ in range(n_layers))
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=N_LAYERS)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "args.json"), "w") as f:
        f.write(str(vars(args)))

    dist.init_process_group("nccl")
    world_size = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (world_size,))
    torch.manual_seed(1234)
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    model = Net(n_layers=args.layers).cuda()
    torch.set_default_dtype(torch.float32)
    torch.save(model.state_dict(), os.path.join(args.out, "init.pt"))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for step in range(10):
        loss = model(torch.randn(4, 8).cuda()).sum()
        loss.backward()
        optimizer.step()
        with open(os.path.join(args.out, "TRAINING-RAN"), "w") as f:
            f.write(str(step))
        raise RuntimeError("the training loop ran")
    print("PRINTED-AFTER-TRAINING")
    raise RuntimeError("code after the training loop ran")


if __name__ == "__main__":
    main()
    raise RuntimeError("the main guard ran past main()")
'''


def _write(tmp_path, text, name="train.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


# the script's own command line, as it is launched (it requires --data)
SCRIPT_ARGS = ["--data", "/nonexistent/data"]


def _run(path, world_size=4, real=False, argv=SCRIPT_ARGS):
    return replay(read_source(path), world_size, real=real, argv=argv)


def _listing(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def _state():
    """Everything the sandbox patches, by identity, plus the process state it touches."""
    import torch.distributed.device_mesh as dm
    import torch.distributed.fsdp as fsdp
    import torch.multiprocessing as tmp

    objs = {
        "cuda.set_device": torch.cuda.set_device, "cuda.current_device": torch.cuda.current_device,
        "cuda.device_count": torch.cuda.device_count, "cuda.is_available": torch.cuda.is_available,
        "dist.init_process_group": dist.init_process_group, "dist.get_world_size": dist.get_world_size,
        "dist.get_rank": dist.get_rank, "dist.is_initialized": dist.is_initialized,
        "dist.destroy_process_group": dist.destroy_process_group,
        "Module.to": nn.Module.to, "Module.cuda": nn.Module.cuda, "Module.to_empty": nn.Module.to_empty,
        "Module.half": nn.Module.half, "Module.requires_grad_": nn.Module.requires_grad_,
        "Tensor.requires_grad_": torch.Tensor.requires_grad_,
        "Parameter.requires_grad": nn.Parameter.__dict__.get("requires_grad"),
        "Optimizer.__init__": torch.optim.Optimizer.__init__,
        "Optimizer.add_param_group": torch.optim.Optimizer.add_param_group,
        "torch.save": torch.save, "torch.compile": torch.compile, "mp.spawn": tmp.spawn,
        "init_device_mesh": dm.init_device_mesh, "fully_shard": fsdp.fully_shard,
        "FSDP": fsdp.FullyShardedDataParallel, "parse_args": argparse.ArgumentParser.parse_args,
        "parse_known_args": argparse.ArgumentParser.parse_known_args, "open": builtins.open,
        "stdout": sys.stdout, "stderr": sys.stderr,
    }
    return {
        "objs": objs,
        "environ": dict(os.environ),
        "argv": list(sys.argv),
        "path": list(sys.path),
        "default_device": str(torch.get_default_device()),
        "torch_defaults": (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads(),
                           torch.random.get_rng_state().tolist()),
        "torch_function_modes": torch._C._len_torch_function_stack(),
        "pg": dist.is_initialized(),
    }


def _assert_same_state(before, after):
    changed = [k for k, v in before["objs"].items() if after["objs"][k] is not v]
    assert not changed, f"left patched: {changed}"
    for key in ("environ", "argv", "path", "default_device", "torch_defaults", "torch_function_modes", "pg"):
        assert after[key] == before[key], key


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)          # relative writes would land here
    return _write(tmp_path, SCRIPT)


# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("real", [False, True], ids=["recorded", "real-fsdp"])
def test_the_script_is_replayed_up_to_the_wrap_and_no_further(script, real):
    res = _run(script, 4, real=real)
    lines = [c.pos.line for c in res.wrap_calls]
    text = open(script).read().splitlines()
    assert [text[ln - 1].strip() for ln in lines] == ["fully_shard(layer, mesh=mesh)"] * 3 + [
        "fully_shard(model, mesh=mesh)"]
    assert [text[o.pos.line - 1].strip()[:20] for o in res.optimizers] == ["optimizer = torch.op"]
    # neither the training loop nor what follows it ran: no exception, nothing written
    assert not os.path.exists(os.path.join(os.path.dirname(script), "out"))


@pytest.mark.parametrize("real", [False, True], ids=["recorded", "real-fsdp"])
def test_training_code_and_checkpoints_write_nothing(script, tmp_path, real):
    before = _listing(tmp_path)
    _run(script, 2, real=real)
    # not the output directory, not args.json (set-up the model does not need never runs), not the
    # checkpoint (torch.save before the wrap), nothing from the training loop. The cache file that the
    # module-level helper writes is written while the replay runs (setup code the model depends on runs as
    # Python runs it) and removed when it ends: what the linted code writes does not outlive the lint
    assert before == ["train.py"]
    assert _listing(tmp_path) == ["train.py"]


def test_the_main_guard_body_runs_only_up_to_the_wrap(tmp_path):
    path = _write(tmp_path, '''
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        if __name__ == "__main__":
            model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
            fully_shard(model[0])
            fully_shard(model)
            raise SystemExit("the guard ran past the wrap")
    ''')
    res = analyse(path, Settings(world_size=2))
    assert [u.modules for u in res.plan.units] == [["0"], [""]]


def test_fsdp_lints_own_argv_is_never_seen(script, monkeypatch):
    # fsdp-lint's own command line has a --layers of its own (and no --data, which the script requires)
    monkeypatch.setattr(sys, "argv", ["fsdp-lint", script, "--layers", "7", "--world-size", "2"])
    res = analyse(script, Settings(world_size=2), argv=SCRIPT_ARGS)
    assert [u.modules for u in res.plan.units] == [["layers.0"], ["layers.1"], ["layers.2"], [""]]
    assert sys.argv == ["fsdp-lint", script, "--layers", "7", "--world-size", "2"]


@pytest.mark.parametrize("real", [False, True], ids=["recorded", "real-fsdp"])
def test_environment_argv_and_torch_are_restored(script, monkeypatch, real):
    monkeypatch.setenv("WORLD_SIZE", "64")          # e.g. fsdp-lint itself running under torchrun
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    before = _state()
    _run(script, 4, real=real)
    _assert_same_state(before, _state())
    assert os.environ["WORLD_SIZE"] == "64" and "LOCAL_RANK" not in os.environ


@pytest.mark.parametrize("real", [False, True], ids=["recorded", "real-fsdp"])
def test_state_is_restored_and_no_process_group_left_when_the_file_fails(tmp_path, real):
    path = _write(tmp_path, '''
        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("nccl")
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        fully_shard(model[0])
        fully_shard(model, reshard_after_forward=model.no_such_attribute)
    ''')
    before = _state()
    with pytest.raises(ReplayError) as info:
        _run(path, 2, real=real)
    assert "\n" not in str(info.value) and "train.py:9" in str(info.value)
    _assert_same_state(before, _state())
    assert not dist.is_initialized()


@pytest.mark.parametrize("real", [False, True], ids=["recorded", "real-fsdp"])
def test_no_process_group_is_initialised(script, real):
    assert not dist.is_initialized()
    _run(script, 2, real=real)
    assert not dist.is_initialized()


@pytest.mark.parametrize("real", [False, True], ids=["recorded", "real-fsdp"])
def test_the_file_sees_the_linted_world_size_as_rank_0(tmp_path, real):
    path = _write(tmp_path, '''
        import os
        import torch
        import torch.distributed as dist
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("nccl")
        assert dist.get_rank() == 0 and int(os.environ["RANK"]) == 0 and int(os.environ["LOCAL_RANK"]) == 0
        assert torch.cuda.device_count() == dist.get_world_size() == int(os.environ["WORLD_SIZE"])
        torch.cuda.set_device(torch.cuda.current_device())
        model = nn.ModuleList(nn.Linear(4, 4) for _ in range(dist.get_world_size()))
        for layer in model:
            fully_shard(layer)
    ''')
    for ws in (2, 3):
        res = _run(path, ws, real=real)
        assert len(res.wrap_calls) == ws


def test_users_prints_do_not_leak_into_fsdp_lint_output(script, capsys, cli):
    analyse(script, Settings(world_size=2), argv=SCRIPT_ARGS)
    _run(script, 2, real=True)
    out, err = capsys.readouterr()
    assert "PRINTED" not in out + err
    res = cli(script, "--world-size", "2", "--format", "json", "--", *SCRIPT_ARGS)
    assert "PRINTED" not in res.out + res.err
    doc = json.loads(res.out)
    assert [u["module"] for u in doc["files"][0]["plan"]["units"]] == ["layers.0", "layers.1", "layers.2", ""]


def test_loops_that_wait_or_load_data_before_the_wrap_do_not_run(tmp_path):
    path = _write(tmp_path, '''
        import os
        import time
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        while not os.path.exists("/nonexistent/ready-file"):
            time.sleep(10)
        batches = []
        for batch in range(10 ** 9):
            batches.append(batch)
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        fully_shard(model)
    ''')
    res = analyse(path, Settings(world_size=2))
    assert [u.modules for u in res.plan.units] == [[""]]


def test_statements_the_model_depends_on_still_run(tmp_path):
    """The slice keeps what the wrap needs: configs mutated after construction, sys.path set-up
    for an import, torch's global defaults, a helper that changes the model in place."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "blocks.py").write_text(textwrap.dedent('''
        import torch.nn as nn

        class Block(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.fc = nn.Linear(d, d)
    '''))
    path = _write(tmp_path, '''
        import os
        import sys
        import torch
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        def main():
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pkg"))
            from blocks import Block
            torch.set_default_dtype(torch.float16)
            cfg = {"layers": 1, "d": 8}
            cfg["layers"] = 3
            cfg.update(d=16)
            model = nn.ModuleList(Block(cfg["d"]) for _ in range(cfg["layers"]))
            freeze(model)
            for block in model:
                fully_shard(block)

        def freeze(model):
            for p in model[0].parameters():
                p.requires_grad = False

        main()
    ''')
    res = analyse(path, Settings(world_size=2))
    assert [u.modules for u in res.plan.units] == [["0"], ["1"], ["2"]]
    assert res.tree.params["0.fc.weight"].shape == (16, 16)
    assert res.tree.params["0.fc.weight"].dtype == "float16"
    assert res.tree.params["0.fc.weight"].requires_grad is False
    assert res.tree.params["1.fc.weight"].requires_grad is True
    assert torch.get_default_dtype() == torch.float32


def test_a_file_that_needs_an_unbuildable_model_fails_with_one_line(tmp_path, cli):
    path = _write(tmp_path, '''
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)
                raise ValueError("needs a checkpoint on disk")

        model = Net()
        fully_shard(model)
    ''')
    with pytest.raises(LintError):
        analyse(path, Settings(world_size=2))
    res = cli(path, "--world-size", "2")
    assert res.code == 2
    assert len(res.err.strip().splitlines()) == 1 and "needs a checkpoint on disk" in res.err
    assert not dist.is_initialized()


def test_a_model_from_a_package_that_is_not_installed_names_the_package(tmp_path, cli):
    path = _write(tmp_path, '''
        import torch
        from torch.distributed.fsdp import fully_shard
        from not_installed_modelzoo.models import BigModel
        import wandb_not_installed_either as wandb

        wandb.init(project="x")
        model = BigModel(layers=4)
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters())
    ''')
    res = cli(path, "--world-size", "2")
    assert res.code == 2
    assert len(res.err.strip().splitlines()) == 1
    # the package the model needs, not the logger it does not
    assert "`not_installed_modelzoo` is not installed" in res.err and "pip install not-installed-modelzoo" in res.err
    assert "wandb" not in res.err


def test_model_target_the_file_never_builds_is_a_clear_error(tmp_path):
    """--model naming another file's class, while the file wraps a model of its own, would apply
    the file's policies to a model they were not written for: refuse with one line."""
    from fsdp_lint.replay import ModelTarget, ReplayError, replay
    from fsdp_lint.entry.source import read_source

    import pytest as _pytest

    with _pytest.raises(ReplayError, match="never builds Transformer"):
        replay(read_source("fixtures/article_fsdp1.py"), 4,
               target=ModelTarget.parse("fixtures/article_model.py:Transformer(num_layers=2)"))
    res = replay(read_source("fixtures/article_fsdp1.py"), 4,
                 target=ModelTarget.parse("fixtures/article_fsdp1.py:Transformer(num_layers=2)"))
    assert len(res.model.layers) == 2


def test_module_settings_read_by_a_main_that_also_trains(tmp_path):
    """nanoGPT style: module-level settings, then a `main()` that builds, wraps, builds the
    optimizer from those settings, and trains. The set-up part of main() runs and needs them."""
    from fsdp_lint.replay import replay
    from fsdp_lint.entry.source import read_source

    path = tmp_path / "train.py"
    path.write_text(
        "import torch\n"
        "import torch.nn as nn\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "learning_rate = 6e-4\n"
        "max_iters = 5000\n"
        "dims = (16, 32)\n"
        "def main():\n"
        "    model = nn.Sequential(nn.Linear(*dims), nn.Linear(dims[1], 4))\n"
        "    for layer in model:\n"
        "        fully_shard(layer)\n"
        "    fully_shard(model)\n"
        "    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate)\n"
        "    for it in range(max_iters):\n"
        "        model(torch.randn(2, dims[0])).sum().backward()\n"
        "        opt.step()\n"
        "        raise SystemExit('the training loop ran')\n"
        "if __name__ == '__main__':\n"
        "    main()\n")
    res = replay(read_source(str(path)), 4)
    assert [c.api for c in res.wrap_calls] == ["fsdp2"] * 3
    assert [o.cls for o in res.optimizers] == ["AdamW"]


def test_torch_compile_of_the_wrapped_model_is_not_the_root(tmp_path):
    """`model = torch.compile(model)` after wrapping holds the model as `_orig_mod`: the model FSDP
    wrapped stays the root (--simulate tracks it as an FSDPModule, not a plain module)."""
    from torch.distributed.fsdp import FSDPModule

    from fsdp_lint.replay import replay
    from fsdp_lint.entry.source import read_source

    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent("""
        import torch
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))

            def forward(self, x):
                for b in self.blocks:
                    x = b(x)
                return x

        model = Net()
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        model = torch.compile(model)
    """))
    for real in (False, True):      # recorded (the lint) and real FSDP2 on meta (--simulate's session)
        res = replay(read_source(str(path)), 4, real=real)
        assert isinstance(res.model, FSDPModule) and "Net" in [c.__name__ for c in type(res.model).__mro__]
