"""bench/bench_host.py: the rules that read torch.profiler's events (what counts as a top-level ATen call, a call from
compiled code, a host sync), and the script on a 2-layer hollow BERT: compilation removes top-level ATen calls, eager
sdpa waits once a step (transformers' padding_mask.all()) and the compiled model never, the framework's cost is a
number. No timing thresholds: this machine's speed says nothing."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.helpers import REPO, bench_module


def _tree(spec, parent=None):
    """Profiler-like events from (name, [children]) pairs, in the order a walk of the profile lists them."""
    name, children = spec
    event = SimpleNamespace(name=name, cpu_parent=parent, cpu_children=[], self_cpu_time_total=10.0)  # microseconds
    events = [event]
    for child in children:
        below = _tree(child, event)
        event.cpu_children.append(below[0])
        events += below
    return events


def test_the_counting_rules_on_a_made_up_profile():
    bench = bench_module("bench_host")
    step = [("aten::linear", [("aten::t", []), ("aten::addmm", [])]),  # one call, doing work
            ("aten::view", []), ("aten::to", []),  # top-level, no kernel
            ("aten::contiguous", [("aten::clone", [("aten::copy_", [])])]),  # top-level, a copy below it
            ("aten::is_nonzero", [("aten::item", [("aten::_local_scalar_dense", [])])]),  # one wait (a copy), outermost
            ("aten::_fused_adamw_", [("aten::item", [("aten::_local_scalar_dense", [])])]),  # the CPU kernel's read
            ("aten::index", [("aten::nonzero", [])]),  # boolean indexing waits on a GPU too
            ("Torch-Compiled Region: 0/0", [("CompiledFunction", [("## Call CompiledFxGraph abc ##", [
                ("aten::mm", []), ("aten::_local_scalar_dense", [])])])]),
            ("autograd::engine::evaluate_function: AddmmBackward0", [("aten::mm", [])])]
    events = [e for spec in step for e in _tree(spec)] * 2  # two steps
    counts = bench.op_counts(events, steps=2)
    assert counts["aten_top_level"] == 8 and counts["aten_top_level_doing_work"] == 6
    assert counts["aten_in_compiled_code"] == 2
    assert counts["host_syncs_by_op"] == {"aten::_local_scalar_dense": 1, "aten::is_nonzero": 1, "aten::nonzero": 1}
    assert counts["host_syncs"] == 3
    # 8 calls that compute below no other working call; 16 that do work, composites (linear, is_nonzero...) included
    assert counts["aten_kernels_ms"] == [0.08, 0.16]


@pytest.mark.slow
@pytest.mark.compile
def test_bench_host_on_a_small_hollow_bert(tmp_path):
    """Eager, the whole model compiled and the Trainer, 2 layers, 3 timed steps: both results files and the figures
    that tell the variants apart."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "bench_host.py"), "--variants", "eager_bf16",
                           "whole_model", "framework", "--layers", "2", "--steps", "3", "--warmup", "1",
                           "--profile_steps", "1", "--compile_cache_dir", str(tmp_path / "compiled"),
                           "--out", str(tmp_path / "results")],
                          cwd=REPO, env=dict(os.environ, HF_HOME=str(tmp_path / "hf"), OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    paths = json.loads(proc.stdout.strip().splitlines()[-1])
    r, md = json.loads(open(paths["json"]).read()), open(paths["markdown"]).read()
    assert paths["json"].rsplit("/", 1)[1].startswith("host-cpu-")
    for key in ("command", "date_utc", "load_avg", "machine", "settings", "rules"):
        assert r[key], key
    assert r["settings"]["parameter_tensors"] == 39 and r["compiles_in_window"] == 0  # 7 + 16 per layer
    v = r["variants"]
    assert set(v) == {"eager_bf16", "whole_model", "framework", "bare"}
    assert all(x["cpu"]["steps"] == 3 and x["cpu"]["median_ms"] > 0 and x["python_calls"] > 0 for x in v.values())
    assert v["whole_model"]["aten_top_level"] < v["eager_bf16"]["aten_top_level"]
    assert v["whole_model"]["aten_in_compiled_code"] > 0 == v["eager_bf16"]["aten_in_compiled_code"]
    assert v["eager_bf16"]["host_syncs_by_op"] == {"aten::is_nonzero": 1}  # transformers' padding_mask.all()
    assert v["whole_model"]["host_syncs"] == 0  # the mask always built, as in every compiled run
    assert v["framework"]["host_syncs"] == v["bare"]["host_syncs"] == 1
    assert v["whole_model"]["warm_up"]["compiles"] >= 1 and v["eager_bf16"]["warm_up"]["compiles"] == 0
    assert v["whole_model"]["inductor_kernels_ms"] > 0 == v["eager_bf16"]["inductor_kernels_ms"]  # its C++ kernels
    assert all(0 < x["cpu_kernels_ms"][0] <= x["cpu_kernels_ms"][1] for x in v.values())
    f = r["framework"]
    assert isinstance(f["cost"]["median_ms"], float) and f["data_fetch"]["median_ms"] > 0 and f["epochs"] == 1
    assert any(row["call"].endswith("(training_step)") for row in f["breakdown"])
    assert any(row["from"] == "bare" for row in f["bare_breakdown"])
    assert "**Framework cost**" in md and r["machine"]["versions"]["torch"] in md
