"""Round 16 of the real-launch survey: launch scripts read as bash runs them -- ``for arg in "$@"`` loops with
``${arg#*=}``, the pattern removals of ``${NAME#...}``/``${NAME%...}``, settings read from a sourced file. The oracle
is real bash (the script run with the launchers replaced by echo)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from conftest import write_tree  # noqa: E402
from test_survey_round15_launch import NETS, TRAIN_ARGS, _bash_echo, _plan  # noqa: E402

FOR_LOOP = '''\
#!/usr/bin/env bash
set -euo pipefail
NPROC=2
LAYERS=2
SCRIPT=train_a.py
for arg in "$@"; do
  case $arg in
    --nproc=*)
      NPROC="${arg#*=}"
      shift
      ;;
    --layers=*) LAYERS="${arg#*=}" ;;
    --script=*) SCRIPT="${arg##*=}" ;;
    *) ;;
  esac
done
RUN_NAME="${SCRIPT%.py}-l${LAYERS}"
torchrun --nproc_per_node=$NPROC "$SCRIPT" --layers "$LAYERS" --run_name "$RUN_NAME"
'''

TRAIN_NAMED = TRAIN_ARGS.replace('parser.add_argument("--lr"', 'parser.add_argument("--run_name")\n    '
                                 'parser.add_argument("--lr"')


def test_a_for_loop_over_the_arguments_with_pattern_removals(cli, tmp_path):
    # `for arg in "$@"; do case $arg in --nproc=*) NPROC="${arg#*=}" ;; esac; done`: each `--opt=value` sets its
    # variable (bash is the oracle); the value after `=` is `${arg#*=}`, and `${SCRIPT%.py}` cuts a suffix
    write_tree(tmp_path, {"train_a.py": TRAIN_NAMED, "train_b.py": TRAIN_NAMED, "run.sh": FOR_LOOP, **NETS})
    given = ["--nproc=4", "--layers=5", "--script=train_b.py"]
    [ran] = _bash_echo(tmp_path / "run.sh", given, cwd=tmp_path)
    assert ran.split() == ["torchrun", "--nproc_per_node=4", "train_b.py", "--layers", "5", "--run_name", "train_b-l5"]
    f = _plan(cli, tmp_path, "run.sh", *given)
    assert f["path"].endswith("train_b.py") and f["plan"]["world_size"] == 4
    assert len(f["plan"]["units"]) == 5 + 1
    # no arguments: the defaults
    [ran] = _bash_echo(tmp_path / "run.sh", cwd=tmp_path)
    assert ran.split() == ["torchrun", "--nproc_per_node=2", "train_a.py", "--layers", "2", "--run_name", "train_a-l2"]
    f = _plan(cli, tmp_path, "run.sh")
    assert f["path"].endswith("train_a.py") and f["plan"]["world_size"] == 2 and len(f["plan"]["units"]) == 3


def test_pattern_removals_expand_as_bash_expands_them(tmp_path):
    from fsdp_lint.entry.bash_words import _expand

    env = {"arg": "--model=org/name=v2", "ckpt": "runs/a/b/step.tar.gz"}
    words = ["${arg#*=}", "${arg##*=}", "${arg%=*}", "${arg%%=*}", "${ckpt%.*}", "${ckpt%%.*}", "${ckpt##*/}",
             "${ckpt#*/}", "${arg#--}"]
    script = tmp_path / "p.sh"
    script.write_text("".join(f'echo "{w}"\n' for w in words))
    import subprocess

    bash = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True,
                          env={**os.environ, **env}).stdout.splitlines()
    assert [_expand(w, env) for w in words] == bash
    # a variable nothing sets stays as written (the launch reader then names it)
    assert _expand("${unset_name#*=}", env) == "${unset_name#*=}"


SOURCED = {
    "configs/common.sh": '''\
        # shared by every launch script
        export NPROC=${NPROC:-4}
        LAYERS=3
    ''',
    "scripts/train.sh": '''\
        #!/usr/bin/env bash
        set -euo pipefail
        SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
        source "${SCRIPT_DIR}/../configs/common.sh"
        . .venv/bin/activate 2>/dev/null || true
        torchrun --nproc_per_node=$NPROC train_a.py --layers $LAYERS
    ''',
}


def test_settings_from_a_sourced_file(cli, tmp_path, monkeypatch):
    # `source "$SCRIPT_DIR/../configs/common.sh"` sets the script's variables as bash sets them; an environment's
    # `activate` that is not there changes nothing a launch reads
    write_tree(tmp_path, {"train_a.py": TRAIN_ARGS, **NETS, **SOURCED})
    monkeypatch.delenv("NPROC", raising=False)
    [ran] = _bash_echo(tmp_path / "scripts/train.sh", cwd=tmp_path)
    assert ran.split() == ["torchrun", "--nproc_per_node=4", "train_a.py", "--layers", "3"]
    f = _plan(cli, tmp_path, "scripts/train.sh")
    assert f["plan"]["world_size"] == 4 and len(f["plan"]["units"]) == 3 + 1
    # the sourced default gives way to the caller's environment, as in bash
    monkeypatch.setenv("NPROC", "2")
    [ran] = _bash_echo(tmp_path / "scripts/train.sh", cwd=tmp_path)
    assert ran.split()[1] == "--nproc_per_node=2"
    assert _plan(cli, tmp_path, "scripts/train.sh")["plan"]["world_size"] == 2


def test_the_separator_torchrun_drops_before_the_scripts_arguments(cli, tmp_path):
    # `torchrun ... -m pkg.train -- ARGS` / `torchrun ... train.py -- ARGS`: torchrun's parser (argparse's REMAINDER)
    # drops the `--`, so the script's own parser never sees it (the oracle: torch's parser)
    from torch.distributed.run import get_args_parser

    write_tree(tmp_path, {"train_a.py": TRAIN_ARGS, "pkg/__init__.py": "", "pkg/train.py": TRAIN_ARGS, **NETS})
    (tmp_path / "run.sh").write_text("torchrun --nproc-per-node 4 -m pkg.train -- --layers 5\n")
    (tmp_path / "run_file.sh").write_text("torchrun --nproc-per-node 4 train_a.py -- --layers 3\n")
    assert get_args_parser().parse_args(["--nproc-per-node", "4", "-m", "pkg.train", "--", "--layers", "5"]
                                        ).training_script_args == ["--layers", "5"]
    f = _plan(cli, tmp_path, "run.sh")
    assert f["plan"]["world_size"] == 4 and len(f["plan"]["units"]) == 5 + 1
    f = _plan(cli, tmp_path, "run_file.sh")
    assert f["plan"]["world_size"] == 4 and len(f["plan"]["units"]) == 3 + 1


def test_a_name_ends_at_a_quote_in_an_assignment(cli, tmp_path):
    # `cfg=configs/"$size"_mp"$mp".json`: bash reads `$size`, then `_mp` (the oracle: bash itself)
    write_tree(tmp_path, {"train_a.py": TRAIN_NAMED, **NETS})
    (tmp_path / "run.sh").write_text('size="$1"\nn="$2"\nname=run/"$size"_n"$n"\n'
                                     'torchrun --nproc_per_node=2 train_a.py --layers "$n" --run_name "$name"\n')
    [ran] = _bash_echo(tmp_path / "run.sh", ["small", "3"], cwd=tmp_path)
    assert ran.split()[-1] == "run/small_n3"
    f = _plan(cli, tmp_path, "run.sh", "small", "3")
    assert f["args"][-1] == "run/small_n3" and len(f["plan"]["units"]) == 3 + 1


def test_text_command_substitutions_are_computed_as_bash_computes_them(cli, tmp_path):
    # `$(basename "$0" | cut -f 1 -d '.')`, `$(basename "$0" .sh)`, `$(echo "$M" | tr '/' '_')`: pure text commands
    # run as bash runs them (the oracle: bash); `$(date +"%Y%m%d%H%M%S")` is one word, a timestamp
    write_tree(tmp_path, {"train_a.py": TRAIN_NAMED, **NETS})
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/stage1.sh").write_text(
        '#!/bin/bash\nname=$(basename "$0" | cut -f 1 -d ".")\nalso=$(basename "$0" .sh)\nM=org/tiny-lm\n'
        'tag=$(echo "$M" | tr \'/\' \'_\')\nstamp=$(date +"%Y%m%d%H%M%S")\n'
        'torchrun --nproc_per_node=2 train_a.py --layers 3 --run_name ${name}-${also}-${tag}-$stamp\n')
    [ran] = _bash_echo(tmp_path / "scripts/stage1.sh", cwd=tmp_path)
    expected = ran.split()[-1]
    f = _plan(cli, tmp_path, "scripts/stage1.sh")
    got = f["args"][-1]
    assert got.rsplit("-", 1)[0] == expected.rsplit("-", 1)[0] == "stage1-stage1-org_tiny-lm"
    assert len(got.rsplit("-", 1)[1]) == 14 and got.rsplit("-", 1)[1].isdigit()
    assert len(f["plan"]["units"]) == 3 + 1


def test_a_launch_inside_a_for_loop_is_linted_for_its_first_run(cli, tmp_path):
    # `for FOLD in {0..4}` / `for FOLD in 0 1 2` / `for ((FOLD=0; FOLD<5; FOLD++))` around the launch: the loop's
    # first run, as bash starts it first (the oracle: bash), noted
    write_tree(tmp_path, {"train_a.py": TRAIN_NAMED, **NETS})
    for header in ("for FOLD in {2..4}", "for FOLD in 2 3", "for ((FOLD=2; FOLD<5; FOLD++))"):
        (tmp_path / "cv.sh").write_text(f"#!/bin/bash\n{header}\ndo\n"
                                        "torchrun --nproc_per_node 2 train_a.py --layers $FOLD --run_name fold${FOLD}\n"
                                        "done\n")
        ran = _bash_echo(tmp_path / "cv.sh", cwd=tmp_path)
        f = _plan(cli, tmp_path, "cv.sh")
        assert f["args"] == ran[0].split()[4:] == ["--layers", "2", "--run_name", "fold2"], header
        assert len(f["plan"]["units"]) == 2 + 1
        assert any("runs it in a loop (`for FOLD`" in n and "FOLD=2" in n for n in f["notes"]), f["notes"]


# Kaldi's option parser, as the speech recipes copy it (the parts a launch reads: `--name value` sets `name`, an
# option the script never set stops it)
PARSE_OPTIONS = r'''
while true; do
  [ -z "${1:-}" ] && break;
  case "$1" in
    --*=*) echo "$0: options to scripts must be of the form --name value, got '$1'"; exit 1 ;;
    --*) name=`echo "$1" | sed s/^--// | sed s/-/_/g`;
      eval '[ -z "${'$name'+xxx}" ]' && echo "$0: invalid option $1" 1>&2 && exit 1;
      eval $name=\"$2\";
      shift 2;;
    *) break
  esac
done
true
'''

STAGES = '''\
#!/bin/bash
stage=0
stop_stage=5
num_layers=2
. tools/parse_options.sh || exit 1;

if [ ${stage} -le 1 ] && [ ${stop_stage} -ge 1 ]; then
  python local/prepare_data.py data/
fi

if [ ${stage} -le 4 ] && [ ${stop_stage} -ge 4 ]; then
  torchrun --nnodes=1 --nproc_per_node=2 train_a.py --layers ${num_layers}
fi
'''


def test_a_kaldi_style_recipe_runs_the_stages_its_options_select(cli, tmp_path):
    # `. tools/parse_options.sh` sets `--stage 4 --stop-stage 4 --num-layers 3` as the script's variables, and the
    # `[ $stage -le N ] && [ $stop_stage -ge N ]` tests pick the stages bash runs (the oracle: bash itself)
    write_tree(tmp_path, {"train_a.py": TRAIN_ARGS, **NETS, "tools/parse_options.sh": PARSE_OPTIONS, "run.sh": STAGES})
    given = ["--stage", "4", "--stop-stage", "4", "--num-layers", "3"]
    assert _bash_echo(tmp_path / "run.sh", given, cwd=tmp_path) == ["torchrun --nnodes=1 --nproc_per_node=2 "
                                                                     "train_a.py --layers 3"]
    f = _plan(cli, tmp_path, "run.sh", *given)
    assert f["args"] == ["--layers", "3"] and len(f["plan"]["units"]) == 3 + 1
    # an option the recipe does not have stops bash, and the lint says so
    res = cli("run.sh", "--no-cache", "--", "--stage", "4", "--bogus", "1", cwd=str(tmp_path))
    assert res.code == 2 and "invalid option" in res.err and "--bogus" in res.err


def test_an_accelerate_config_built_from_arguments_not_given(cli, tmp_path):
    # `accelerate launch --config_file $FSDP_DIR/config_rank$RANK.yaml` with `FSDP_DIR=$2 RANK=$3`: run without its
    # arguments the path is `/config_rank.yaml` (bash agrees), and the line says the arguments were not given
    write_tree(tmp_path, {"train_a.py": TRAIN_ARGS, **NETS})
    (tmp_path / "launch.sh").write_text("export OUT=$1\nexport FSDP_DIR=$2\nexport RANK=$3\n"
                                        "accelerate launch --config_file $FSDP_DIR/config_rank$RANK.yaml train_a.py\n")
    [ran] = _bash_echo(tmp_path / "launch.sh", cwd=tmp_path)
    assert ran.split()[:3] == ["accelerate", "launch", "--config_file"] and ran.split()[3] == "/config_rank.yaml"
    res = cli("launch.sh", "--no-cache", cwd=str(tmp_path))
    assert res.code == 2
    line = res.err.strip().splitlines()[0]
    assert "line 4: accelerate's --config_file is /config_rank.yaml, which is not there" in line
    assert "$1, $2, $3" in line and "-- ARGS" in line


def test_the_gpus_a_script_counts_from_its_own_cuda_visible_devices(cli, tmp_path):
    # `num_gpus=$(echo $CUDA_VISIBLE_DEVICES | awk -F "," '{print NF}')` (WeNet's recipes): awk that only prints runs
    # as bash runs it (the oracle: bash); its text had been split into the launch line, and the launch was lost
    write_tree(tmp_path, {"train_a.py": TRAIN_ARGS, **NETS})
    (tmp_path / "run.sh").write_text('#!/bin/bash\nexport CUDA_VISIBLE_DEVICES="0,1,2"\n'
                                     'num_gpus=$(echo $CUDA_VISIBLE_DEVICES | awk -F "," \'{print NF}\')\n'
                                     'torchrun --nproc_per_node=$num_gpus train_a.py --layers 2\n')
    [ran] = _bash_echo(tmp_path / "run.sh", cwd=tmp_path)
    assert ran.split()[1] == "--nproc_per_node=3"
    assert _plan(cli, tmp_path, "run.sh")["plan"]["world_size"] == 3


def test_a_recipe_that_detects_the_nodes_gpus(cli, tmp_path):
    # WeNet/ESPnet recipes: `if command -v nvidia-smi &> /dev/null; then num_gpus=$(nvidia-smi -L | wc -l);
    # gpu_list=$(seq -s, 0 $((num_gpus-1))); else ...; fi`, then the GPU count from CUDA_VISIBLE_DEVICES. The oracle:
    # bash on a node, an `nvidia-smi` on its PATH listing --gpus-per-node GPUs; the else branch had made it a world of 1
    write_tree(tmp_path, {"train_a.py": TRAIN_ARGS, **NETS})
    (tmp_path / "run.sh").write_text('''#!/bin/bash
if command -v nvidia-smi &> /dev/null; then
  num_gpus=$(nvidia-smi -L | wc -l)
  gpu_list=$(seq -s, 0 $((num_gpus-1)))
else
  num_gpus=-1
  gpu_list="-1"
fi
export CUDA_VISIBLE_DEVICES="${gpu_list}"
num_gpus=$(echo $CUDA_VISIBLE_DEVICES | awk -F "," '{print NF}')
torchrun --nnodes=1 --nproc_per_node=$num_gpus train_a.py --layers 2
''')
    node_bin = tmp_path / "node-bin"
    node_bin.mkdir()
    (node_bin / "nvidia-smi").write_text('#!/bin/bash\nfor i in 0 1 2 3; do echo "GPU $i: NVIDIA H100 80GB HBM3"; done\n')
    (node_bin / "nvidia-smi").chmod(0o755)
    [ran] = _bash_echo(tmp_path / "run.sh", env={"PATH": f"{node_bin}:{os.environ['PATH']}"}, cwd=tmp_path)
    assert ran.split()[2] == "--nproc_per_node=4"
    res = cli("run.sh", "--no-cache", "--gpus-per-node", "4", "--format", "json", cwd=str(tmp_path))
    assert res.code in (0, 1), res.err
    import json

    assert json.loads(res.out)["files"][0]["plan"]["world_size"] == 4
