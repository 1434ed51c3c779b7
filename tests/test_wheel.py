"""The wheel ships the registry: built from this checkout, installed (not editable) into a
fresh environment and imported from outside the repository, a call on a tuned H200 shape
resolves its config ``exact`` from the shipped registry, and tuning would write elsewhere.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

CHECK = """
import sys
from pathlib import Path
import torch
import helion_kernels
from helion_kernels import registry, runtime, workloads
from helion_kernels.techniques import get_spec

package = Path(helion_kernels.__file__).parent
assert package.is_relative_to(sys.prefix), package          # the installed copy, not the checkout
assert registry.shipped_dir() == package / "_configs", registry.shipped_dir()
assert not registry.user_dir().is_relative_to(package)      # tuning never writes into the package
assert "prenorm_rmsnorm" in workloads.list_workloads()
assert "flash_norm_attention" in workloads.list_workloads("attention")

registry.gpu_key = lambda device=None: "nvidia_h200_sm90"   # stand in for an H200
spec = get_spec("rmsnorm_matmul")
args = (torch.empty(65536, 1024, dtype=torch.bfloat16, device="meta"),
        torch.empty(1024, 1024, dtype=torch.bfloat16, device="meta"), 1e-5)
resolved = runtime.resolve(spec, args)
assert resolved.source == "exact", resolved
print("resolved", resolved.source, resolved.config, "from", registry.shipped_dir())
"""


@pytest.mark.ref_mode  # CPU session only (about half a minute: a wheel build and a venv)
def test_installed_wheel_resolves_shipped_configs(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)],
                   check=True, capture_output=True)
    (wheel,) = dist.glob("helion_kernels-*.whl")
    env = tmp_path / "env"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True)
    # The dependencies (torch, helion, ...) come from this test's environment, listed after the
    # fresh environment's own packages; that environment's editable-install hooks are not
    # run (a .pth line adds a path, not a site directory).
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HELION_KERNELS_CONFIG_DIR")}
    run = subprocess.run([str(python), "-c", CHECK], cwd=tmp_path, env=clean, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "resolved exact" in run.stdout
    helion_list = subprocess.run([str(env / "bin" / "helion-kernels"), "list"], cwd=tmp_path, env=clean,
                                 capture_output=True, text=True)
    assert helion_list.returncode == 0, helion_list.stderr[-2000:]
    assert "_configs" in helion_list.stdout and "rmsnorm_matmul" in helion_list.stdout
