"""Profiling: a real tiny run with --profile writes the operator table, a valid Chrome trace and
a memory summary for the scheduled steps only, and trains exactly as the run without it."""
import json

import pytest

from tests.helpers import losses as logged_losses
from tests.helpers import PLAIN, results, tiny_run

# The profiled run differs from the plain one only in --profile (and in giving no --peak_tflops,
# which only changes a reported figure: the CPU has no peak, so MFU must be null).
PROFILE = ("--profile", "true", "--profile_wait", "1", "--profile_warmup", "1", "--profile_active", "3",
           "--profile_repeat", "1")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tiny_run(tmp_path_factory, *PLAIN), tiny_run(tmp_path_factory, "profiled", *PROFILE)


@pytest.mark.slow
def test_profile_files(runs):
    _, out = runs
    folder = out / "profile"
    assert sorted(p.name for p in folder.iterdir()) == ["memory.txt", "operators.txt", "profile.json", "trace.json"]
    table = (folder / "operators.txt").read_text()
    assert "aten::" in table and "aten::addmm" in table and "self_cpu_time_total" in table
    trace = json.loads((folder / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert len(events) > 100 and any(str(e.get("name", "")).startswith("aten::") for e in events)
    assert any(str(e.get("name", "")).startswith("ProfilerStep#") for e in events)
    memory = (folder / "memory.txt").read_text()
    assert "self_cpu_memory_usage" in memory and "aten::" in memory and "peak RSS" in memory


@pytest.mark.slow
def test_only_the_scheduled_steps_are_recorded(runs):
    _, out = runs
    index = json.loads((out / "profile" / "profile.json").read_text())
    assert [c["global_steps"] for c in index["cycles"]] == [[3, 4, 5]]  # wait 1, warmup 1, active 3
    trace = json.loads((out / "profile" / "trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert len({e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}) == 3
    assert results(out)["train_profiled_steps"] == [3, 4, 5]
    # a CPU run has no device: no busy share, and the record says why
    assert index["cycles"][0]["device_busy"] == {"share": None, "why": "no device activity recorded"}
    assert results(out)["train_profile_device_busy_share"] is None
    # the host's waits are read on a CPU too: the next batch, never the device
    waits = results(out)["train_profile_host_waits"]
    assert waits == index["cycles"][0]["host_waits"] and 0 < waits["data_wait_share"] < 1, waits
    assert waits["device_wait_share"] == 0 and waits["launches_per_step"] == 0 and waits["step_ms"] > 0


def test_device_busy_share_is_the_union_of_device_activity_over_the_steps():
    from qa.training.profiling import device_busy

    step = lambda ts, dur, n: {"ph": "X", "name": f"ProfilerStep#{n}", "cat": "user_annotation", "ts": ts, "dur": dur}  # noqa: E731
    device = lambda ts, dur, cat="kernel": {"ph": "X", "name": "k", "cat": cat, "ts": ts, "dur": dur}  # noqa: E731
    host_op = {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 0, "dur": 200}
    # overlapping kernels count once; the device runs past the host's last step, which stretches the span
    trace = {"traceEvents": [step(0, 100, 1), step(100, 100, 2), device(10, 20), device(20, 30),
                             device(150, 110, "gpu_memcpy"), host_op]}
    busy = device_busy(trace)
    assert busy["share"] == pytest.approx((40 + 110) / 260, abs=1e-4) and busy["span_us"] == 260
    assert device_busy({"traceEvents": [step(0, 100, 1), device(0, 100)]})["share"] == 1.0
    assert device_busy({"traceEvents": [device(0, 10)]}) == {"share": None, "why": "no recorded step"}


def test_host_waits_are_shares_of_the_steps_host_time():
    from qa.training.profiling import host_waits

    def event(name, ts, dur, cat="cuda_runtime"):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}

    next_batch = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
    trace = {"traceEvents": [event("ProfilerStep#1", 0, 100, "user_annotation"),
                             event("ProfilerStep#2", 100, 300, "user_annotation"),
                             event("ProfilerStep#2", 120, 900, "gpu_user_annotation"),  # the GPU's copy: not a step
                             event(next_batch, 5, 40, "user_annotation"), event(next_batch, 400, 30, "user_annotation"),
                             event("cudaStreamSynchronize", 150, 60), event("cudaMemcpyAsync", 140, 10),
                             event("cudaEventSynchronize", 250, 20), event("cudaLaunchKernel", 10, 5),
                             event("cuLaunchKernel", 20, 5, "cuda_driver"), event("cudaLaunchKernelExC_v11060", 30, 5),
                             event("cudaGraphLaunch", 380, 5), event("aten::mm", 0, 50, "cpu_op")]}
    # the second batch was fetched after the last step's end: outside the steps, not counted
    assert host_waits(trace) == {"data_wait_share": 0.1, "device_wait_share": 0.2, "step_ms": 0.2,
                                 "launches_per_step": 2.0}
    assert host_waits({"traceEvents": [event("cudaLaunchKernel", 0, 1)]}) == {"why": "no recorded step"}


@pytest.mark.slow
def test_profiling_does_not_change_training(runs):
    plain, profiled = runs
    a, b = results(plain), results(profiled)
    for key in ("train_loss", "eval_f1", "eval_exact_match", "eval_loss"):
        assert a[key] == b[key], key
    losses = [logged_losses(o) for o in runs]
    assert losses[0] == losses[1] and len(losses[0]) >= 5
    assert not (plain / "profile").exists()


@pytest.mark.slow
def test_cpu_mfu_is_null_without_peak(runs):
    _, out = runs
    res = results(out)
    assert res["train_mfu"] is None and res["train_peak_tflops"] is None
    assert "--peak_tflops" in res["train_peak_tflops_source"]
    assert res["train_tflops_per_device"] > 0


def test_training_shorter_than_the_schedule_writes_nothing(tmp_path, caplog):
    """In-process, on a fake state: the profiler starts and stops cleanly when training ends
    before its first recorded step."""
    from types import SimpleNamespace

    import torch

    from qa.training.profiling import ProfilerCallback

    cb = ProfilerCallback(tmp_path, wait=5, warmup=1, active=1)
    args = SimpleNamespace(device=torch.device("cpu"))
    state = SimpleNamespace(is_world_process_zero=True, global_step=0)
    cb.on_train_begin(args, state, None)
    for _ in range(2):
        torch.ones(4).sum()
        state.global_step += 1
        cb.on_step_end(args, state, None)
    cb.on_train_end(args, state, None)
    assert cb.prof is None and cb.summary() == {}
    assert not list((tmp_path / "profile").iterdir())
    assert "before the first recorded step" in caplog.text


def test_other_ranks_do_not_profile(tmp_path):
    from types import SimpleNamespace

    import torch

    from qa.training.profiling import ProfilerCallback

    cb = ProfilerCallback(tmp_path)
    cb.on_train_begin(SimpleNamespace(device=torch.device("cpu")),
                      SimpleNamespace(is_world_process_zero=False, global_step=0), None)
    assert cb.prof is None and not (tmp_path / "profile").exists()
