#!/bin/bash
# per-pin overlays of venv-drift (PYTHONPATH=/work/venv-drift/overlays/NAME): the HF libraries each
# repository pins, installed without dependencies (torch stays the on-disk 2.13.0 CPU wheel of the base)
P=${DRIFT:-/work/venv-drift}/bin/pip
O=${DRIFT:-/work/venv-drift}/overlays
mk() { name=$1; shift; echo "== $name: $*"; $P install -q --no-deps --target $O/$name/site-packages "$@" 2>&1 | grep -v "^WARNING: Location"; echo "pip rc=${PIPESTATUS[0]}"; }
mk tf436 transformers==4.36.2 tokenizers==0.15.2 huggingface_hub==0.20.3 accelerate==0.25.0 peft==0.7.1 datasets==2.16.1 fsspec==2023.10.0 dill==0.3.7 multiprocess==0.70.15 pyarrow-hotfix==0.6
mk tf444 transformers==4.44.2 tokenizers==0.19.1 huggingface_hub==0.24.6 accelerate==0.34.2 peft==0.12.0 datasets==2.21.0 fsspec==2024.6.1 dill==0.3.8 multiprocess==0.70.16
mk tf446_trl012 transformers==4.46.1 trl==0.12.0 tokenizers==0.20.3 huggingface_hub==0.26.2 accelerate==1.0.1 peft==0.13.2 datasets==3.1.0 fsspec==2024.9.0 dill==0.3.8 multiprocess==0.70.16
mk tf452_trl018 transformers==4.52.3 trl==0.18.0 tokenizers==0.21.1 huggingface_hub==0.32.2 accelerate==1.4.0 peft==0.15.2 datasets==3.6.0 fsspec==2025.3.0 dill==0.3.8 multiprocess==0.70.16
mk tf456_trl023 transformers==4.56.2 trl==0.23.1 tokenizers==0.22.1 huggingface_hub==0.35.3 accelerate==1.10.1 peft==0.17.1 datasets==4.0.0 fsspec==2025.3.0 dill==0.3.8 multiprocess==0.70.16
# alignment-handbook sft: its recipes pass max_seq_length, which trl 0.20 removed (put first, before tf456_trl023)
mk trl0191 trl==0.19.1
echo OVERLAYS_DONE
