"""The distribution to install for a module that is not installed: known renames (`cv2` is opencv-python), the
package the repository's requirements declare for it (installed top-level names, the name's initials), and the
CUDA-built packages a machine without a CUDA torch and compiler cannot install."""
from __future__ import annotations

import os
from typing import Dict, Tuple

from fsdp_lint.replay.requirements import declared_distributions, declared_from_url


# import names whose PyPI distribution is called something else
_DISTRIBUTIONS = {
    "sklearn": "scikit-learn", "skimage": "scikit-image", "cv2": "opencv-python", "PIL": "Pillow",
    "yaml": "PyYAML", "bs4": "beautifulsoup4", "attr": "attrs", "google.protobuf": "protobuf",
    "flash_attn": "flash-attn", "apex": "apex (NVIDIA/apex, built from source)", "Crypto": "pycryptodome",
    "dateutil": "python-dateutil", "dotenv": "python-dotenv", "jwt": "PyJWT", "magic": "python-magic",
    "sentencepiece": "sentencepiece", "tensorboardX": "tensorboardX", "torch_xla": "torch-xla",
    "lightning_fabric": "lightning", "pytorch_lightning": "lightning", "omegaconf": "omegaconf",
    "hydra": "hydra-core", "fire": "fire", "te": "transformer-engine", "transformer_engine": "transformer-engine",
    "mamba_ssm": "mamba-ssm", "causal_conv1d": "causal-conv1d", "xformers": "xformers",
    "bitsandbytes": "bitsandbytes", "liger_kernel": "liger-kernel", "webdataset": "webdataset",
    "tiktoken": "tiktoken", "zmq": "pyzmq", "serial": "pyserial", "usb": "pyusb", "docx": "python-docx",
    "google.oauth2": "google-auth", "Levenshtein": "python-Levenshtein", "git": "GitPython", "pkg_resources": "'setuptools<82'",   # setuptools 82 removed pkg_resources
    "streaming": "mosaicml-streaming", "mcli": "mosaicml-cli", "composer": "mosaicml",
    "dora": "dora-search", "lm_eval": "lm-eval", "imageio_ffmpeg": "imageio-ffmpeg", "fitz": "PyMuPDF",
    "Bio": "biopython", "skvideo": "scikit-video",
}


def distribution_of(module: str) -> str:
    """The PyPI name that provides import `module` (``sklearn`` -> ``scikit-learn``); one the project
    declares wins over the guess (``olmo_core``: its ``ai2-olmo-core``, not ``olmo-core``)."""
    top = module.split(".")[0]
    guess = _guess_distribution(module)
    if module in _DISTRIBUTIONS or top in _DISTRIBUTIONS:
        return guess + _needs_cuda(top)
    declared = declared_distributions()
    if guess not in declared:
        for name in declared:
            # mosaicml-streaming, ibm-fms, ai2-olmo-core; open-clip-torch
            if name.endswith("-" + guess) or name.startswith(guess + "-"):
                guess = name
                break
        else:
            guess = next((name for name in declared if _provides(name, top)), guess)
    url = declared_from_url(guess) if guess in declared else None
    return f"'{url}'" if url else guess + _needs_cuda(top)        # pip install 'name @ git+https://...


# packages whose kernels are compiled against CUDA when they are installed: pip cannot install them where there is
# no CUDA toolkit (a CPU-only linting machine), while every GPU node of the job has them
_BUILT_WITH_CUDA = frozenset({"flash_attn", "flash_attn_interface", "flash_attn_2_cuda", "mamba_ssm",
                              "causal_conv1d", "transformer_engine", "apex", "selective_scan_cuda"})


def _needs_cuda(top: str) -> str:
    if top not in _BUILT_WITH_CUDA:
        return ""
    import shutil

    import torch

    if torch.version.cuda is not None and (shutil.which("nvcc") or os.environ.get("CUDA_HOME")):
        return ""
    # (its build compiles against the installed torch's CUDA: a CPU-only torch, or no CUDA compiler, cannot)
    return (" -- which cannot be installed on this machine: its build needs a CUDA torch and CUDA compiler, which "
            "this machine lacks; lint where the GPU nodes' environment is installed")


def _provides(distribution: str, top: str) -> bool:
    """Whether the declared `distribution` is the one that installs import `top` where their names differ: the
    installed distributions' own top-level names say so, else the name's initials (typed-argument-parser's
    ``tap``: PyPI's ``tap`` is another package) or a ``python-``/``py`` prefix (``pyyaml``'s ``yaml``)."""
    if distribution in _installed_providers().get(top, ()):
        return True
    words = distribution.split("-")
    key = top.lower().replace("_", "")
    return (len(words) > 1 and "".join(w[0] for w in words if w) == key) or \
        any(distribution == prefix + key for prefix in ("python-", "py"))


def _installed_providers() -> Dict[str, Tuple[str, ...]]:
    """import name -> the installed distributions that provide it (normalised as requirements are)."""
    if not _PROVIDERS:
        import importlib.metadata
        import re

        try:
            found = importlib.metadata.packages_distributions()
        except Exception:  # noqa: BLE001  odd metadata: no answer from it
            found = {}
        _PROVIDERS.update({top: tuple(re.sub(r"[-_.]+", "-", d).lower() for d in dists) for top, dists in found.items()})
        _PROVIDERS.setdefault("", ())
    return _PROVIDERS


_PROVIDERS: Dict[str, Tuple[str, ...]] = {}


def _guess_distribution(module: str) -> str:
    top = module.split(".")[0]
    for key in (module, top):
        if key in _DISTRIBUTIONS:
            return _DISTRIBUTIONS[key]
    parts = module.split(".")
    for space, prefix in _NAMESPACES.items():
        depth = space.count(".") + 1
        if parts[:depth] == space.split(".") and len(parts) > depth:
            for key in (".".join(parts[:depth + 1]),):
                if key in _DISTRIBUTIONS:
                    return _DISTRIBUTIONS[key]
            return prefix + parts[depth].replace("_", "-")
    return top.replace("_", "-")


# namespace packages whose parts are separate distributions: google.cloud.storage is google-cloud-storage,
# google.api_core google-api-core, google.auth google-auth (google.protobuf is protobuf, above)
_NAMESPACES = {"google.cloud": "google-cloud-", "google": "google-"}


def requirement(imp) -> str:
    """What to ``pip install`` for the failed import `imp`: the distribution of the most specific module the
    failing import names (``from google.api_core.exceptions import NotFound`` fails on the missing
    ``google``: google-api-core, not google), inside a library too."""
    for module in (imp.imported, imp.module.lstrip(".")):
        if module == imp.missing or module.startswith(imp.missing + "."):
            if module == imp.module.lstrip(".") and module in _NAMESPACES and imp.names:
                module = f"{module}.{imp.names[0]}"       # `from google.cloud import storage`
            return distribution_of(module)
    return distribution_of(imp.missing)
