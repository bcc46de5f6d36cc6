"""Round 15 of the real-launch survey: the simulated node answering as a GPU node would (meshes bound from
torch's alias modules, files loaded in a module's ``__init__``, index tensors, the project's print patch,
data sets filled from missing files, other ranks' files, snapshot weights, stand-in weights saved, CUDA-only
packages). Each fixture is written in the idiom met; the oracle is real torch, python or the library itself."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from conftest import run_subprocess  # noqa: E402,F401


def _tree(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _plan(res):
    return json.loads(res.out)["files"][0]["plan"]


# composer's idiom: the mesh function bound from torch's deprecated alias module, in a helper module of the project
MESH_HELPER = '''
    from __future__ import annotations

    {import_line}


    def data_parallel_mesh(world: int):
        return init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("replicate", "shard"))
'''
MESH_TRAIN = '''
    from __future__ import annotations

    import sys

    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import fully_shard

    from project.parallel import data_parallel_mesh

    dist.init_process_group("nccl")
    mesh = data_parallel_mesh(dist.get_world_size())
    model = nn.Sequential(*[nn.Linear(128, 128) for _ in range(int(sys.argv[1]))])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
'''


@pytest.mark.parametrize("import_line", [
    "from torch.distributed._tensor.device_mesh import init_device_mesh",
    "from torch.distributed.tensor.device_mesh import init_device_mesh",
    "from torch.distributed.tensor import init_device_mesh",
])
def test_init_device_mesh_bound_from_an_alias_module_is_the_simulated_mesh(cli, tmp_path, import_line):
    # the oracle: python says every alias module holds torch's one init_device_mesh, so a script binding it from
    # any of them builds the same mesh as one binding it from torch.distributed.device_mesh
    module = import_line.split()[1]
    probe = run_subprocess(["-c", "import warnings; warnings.simplefilter('ignore'); import importlib; "
                                  "import torch.distributed.device_mesh as d; "
                                  f"print(importlib.import_module('{module}').init_device_mesh is d.init_device_mesh)"])
    assert probe.stdout.strip() == "True", probe.stderr
    plans = []
    for name, line in (("alias", import_line), ("control", "from torch.distributed.device_mesh import init_device_mesh")):
        root = tmp_path / name
        _tree(root, {"train.py": MESH_TRAIN, "project/__init__.py": "",
                     "project/parallel.py": MESH_HELPER.format(import_line=line)})
        res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", "3", cwd=str(root))
        assert res.code in (0, 1), res.err
        plans.append(_plan(res))
    alias, control = plans
    assert alias["mesh"]["shape"] == control["mesh"]["shape"] == [2, 4]
    assert [u["shard_group_size"] for u in alias["units"]] == [u["shard_group_size"] for u in control["units"]] == [4] * 4
    assert [u["replicate_group_size"] for u in alias["units"]] == [2] * 4


# torchtools' SmartCrop: a module loads a small bundled checkpoint in its constructor, and what it holds decides the
# model (here the depth); a file that exists is loaded for real, whoever's __init__ loads it
BUNDLED_LOAD = {
    "train.py": '''
        from __future__ import annotations

        import sys

        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        from project.model import Block, Net

        dist.init_process_group("nccl")
        model = FSDP(Net(sys.argv[1]), auto_wrap_policy=ModuleWrapPolicy([Block]), device_id=torch.cuda.current_device())
    ''',
    "project/__init__.py": "",
    "project/model.py": '''
        from __future__ import annotations

        import os

        import torch
        import torch.nn as nn

        HERE = os.path.dirname(__file__)


        def load_bundled(name: str) -> dict:
            path = os.path.join(HERE, name)
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file
                return load_file(path)
            return torch.load(path, map_location="cpu")


        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.l = nn.Linear(64, 64)


        class Net(nn.Module):
            def __init__(self, bundled: str):
                super().__init__()
                state = load_bundled(bundled)
                self.crop = nn.Conv2d(3, 1, 3).requires_grad_(False)
                self.crop.load_state_dict({k: v for k, v in state.items() if k != "depth"})
                self.blocks = nn.ModuleList(Block() for _ in range(int(state["depth"])))
    ''',
}


@pytest.mark.parametrize("bundled", ["legacy.pt", "zip.pt", "weights.safetensors"])
def test_a_bundled_file_loaded_in_a_module_init_holds_its_values(cli, tmp_path, bundled):
    _tree(tmp_path, BUNDLED_LOAD)
    import torch
    import torch.nn as nn

    state = dict(nn.Conv2d(3, 1, 3).state_dict(), depth=torch.tensor(3))
    path = tmp_path / "project" / bundled
    if bundled.endswith(".safetensors"):
        from safetensors.torch import save_file
        save_file(state, str(path))
        from safetensors.torch import load_file
        depth = int(load_file(str(path))["depth"])
    else:
        torch.save(state, str(path), _use_new_zipfile_serialization=bundled == "zip.pt")
        depth = int(torch.load(str(path), map_location="cpu")["depth"])     # the oracle: torch itself
    assert depth == 3
    res = cli("train.py", "-n", "8", "--no-cache", "--format", "json", "--", bundled, cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    plan = _plan(res)
    assert sum(u["class"] == "Block" for u in plan["units"]) == depth
