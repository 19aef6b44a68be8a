"""qa.distributed: the switches that shrink gradient communication (PyTorch's own hooks) really
act on the wrapped model; and the scaling study's opt-in measurement (scaling/comm_measure.py,
--measure_communication true) records consistent figures in a distributed run (torchrun, 2 gloo
processes on the CPU), which trains exactly as it would without it. Speeds are not checked."""
import json
import math
import os
import socket
import sys

import pytest
import torch

from tests.helpers import REPO, TINY, TORCHRUN, needs_compile, offline_env, results, run_qa
from tests.helpers import losses as logged_losses


# ---------------------------------------------------------------------------------------------
# The compression hook on a real DDP model (2 gloo processes)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hook_worker(rank, port, hook, out):
    import torch.distributed as dist

    from qa.distributed import DDP_HOOKS, exit_process

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 32), bucket_cap_mb=1)
    if hook != "none":
        model.register_comm_hook(state=None, hook=DDP_HOOKS[hook])
    registered = [h.__name__ for h, _ in model._comm_hooks] or None
    torch.manual_seed(1 + rank)  # different data on each rank: the average is a real reduction
    model(torch.randn(8, 64)).pow(2).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    if rank == 0:
        torch.save({"registered": registered, "grads": grads}, out)
    dist.barrier()
    exit_process(0)  # as run_qa.py's ranks leave: without gloo's teardown, which can abort a finished rank


def _synced_gradients(tmp_path, hook):
    out = tmp_path / f"{hook}.pt"
    torch.multiprocessing.spawn(_hook_worker, args=(_free_port(), hook, str(out)), nprocs=2)
    return torch.load(out)


@pytest.mark.slow
def test_compression_hook_sends_16_bit_gradients(tmp_path):
    """With PyTorch's fp16 hook (its bf16 one needs NCCL) the averaged gradients are exactly
    16-bit values (they travelled in 16 bits); without it they are not. They still agree with the
    exact average to 16-bit precision."""
    dtype = torch.float16
    plain = _synced_gradients(tmp_path, "none")
    compressed = _synced_gradients(tmp_path, "fp16")
    assert plain["registered"] is None and compressed["registered"] == ["fp16_compress_hook"]

    def representable(g):
        return bool(torch.equal(g.to(dtype).to(torch.float32), g))

    assert representable(compressed["grads"]) and not representable(plain["grads"])
    # Each rank's half and their sum are rounded to 16 bits: errors of a few units in the last
    # place of the largest values, wherever ranks cancel out too.
    scale = plain["grads"].abs().max()
    assert (compressed["grads"] - plain["grads"]).abs().max() <= 2 ** -6 * scale


def test_a_hook_that_cannot_act_is_a_warning(caplog):
    """One process (no DDP wrapper): no hook, one warning, training goes on."""
    from types import SimpleNamespace

    from qa.distributed import DDPCompressionHook

    hook = DDPCompressionHook("bf16")
    hook.bind(SimpleNamespace(model_wrapped=torch.nn.Linear(2, 2)))
    hook.on_train_begin(None, None, None)
    assert "--ddp_comm_hook bf16: no hook: Linear is not DDP" in caplog.text


def test_fsdp_reduce_dtype_reaches_accelerates_plugin():
    """What can be checked without a GPU: the dtype accelerate's FSDP plugin will shard with
    (accelerate runs FSDP requests as DDP on a CPU, so the sharded model exists only on GPUs)."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from qa.distributed import set_fsdp_reduce_dtype

    plain = FullyShardedDataParallelPlugin(fsdp_version=2)
    set_fsdp_reduce_dtype(plain, "bf16")
    assert plain.mixed_precision_policy == MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)
    mixed = FullyShardedDataParallelPlugin(fsdp_version=2)
    mixed.set_mixed_precision("bf16")  # what accelerate does under --bf16: params and reduction in bf16
    set_fsdp_reduce_dtype(mixed, "fp32")
    assert mixed.mixed_precision_policy.param_dtype == torch.bfloat16  # the run's precision is kept
    assert mixed.mixed_precision_policy.reduce_dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# Distributed runs through run_qa.py


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 2-process run three times: measuring (the scaling study's opt-in), not measuring
    (the default), and measuring with the switches (fp16 compression, 1 MiB buckets)."""
    env = offline_env(tmp_path_factory)
    args = [*TINY, "--do_train", "--save_strategy", "no", "--report_to", "none", "--num_train_epochs", "6",
            "--logging_steps", "3", "--ddp_find_unused_parameters", "false"]
    out = {}
    measure = ["--measure_communication", "true"]
    for name, extra in (("measured", measure), ("unmeasured", []),
                        ("switches", [*measure, "--ddp_comm_hook", "fp16", "--ddp_bucket_cap_mb", "1"])):
        folder = tmp_path_factory.mktemp(name)
        proc = run_qa([*args, *extra, "--output_dir", str(folder)], env, launcher=TORCHRUN)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = folder
    return out


@pytest.mark.slow
@pytest.mark.torchrun
def test_measurement_is_recorded_and_consistent(runs):
    r = results(runs["measured"])
    assert r["comm_world_size"] == 2 and r["comm_nodes"] == 1 and r["comm_backend"] == "gloo"
    assert r["comm_wrapper"] == "DistributedDataParallel"
    # A buffer as large as the gradients, in their dtype
    assert r["comm_grad_dtype"] == r["train_grad_dtype"] == "float32"
    assert r["comm_allreduce_bytes"] == r["comm_grad_bytes"] == r["train_grad_bytes"] > 0
    assert r["comm_allreduce_dtype"] == "float32" and r["comm_allreduce_ranks"] == 2
    n = r["comm_allreduce_ranks"]
    assert 0 < r["comm_allreduce_s"] < 60
    assert r["comm_allreduce_algbw_GBps"] == pytest.approx(r["comm_allreduce_bytes"] / r["comm_allreduce_s"] / 1e9,
                                                           rel=1e-3)
    assert r["comm_allreduce_busbw_GBps"] == pytest.approx(r["comm_allreduce_algbw_GBps"] * 2 * (n - 1) / n, rel=1e-6)
    # One node: no within-node figure to add
    assert "comm_intranode_s" not in r and "comm_intranode_note" not in r
    # A real step with and without the synchronisation
    assert r["comm_step_sync_s"] > 0 and r["comm_step_nosync_s"] > 0
    assert r["comm_exposed_s"] == pytest.approx(max(r["comm_step_sync_s"] - r["comm_step_nosync_s"], 0), abs=2e-6)
    assert 0 <= r["comm_exposed_share"] <= 1
    assert r["comm_step_batch_shape"][0] == 32  # the run's per-device batch
    assert r["comm_ddp_comm_hook"] == "none" and r["comm_ddp_bucket_cap_mb"] == 25  # DDP's default
    assert "communication" not in json.loads((runs["measured"] / "environment.json").read_text())
    md = (runs["measured"] / "results.md").read_text()
    assert "| all-reduce of the gradients, whole group |" in md and "| exposed communication per step |" in md


@pytest.mark.slow
@pytest.mark.torchrun
def test_measurement_does_not_change_training(runs):
    measured, unmeasured = results(runs["measured"]), results(runs["unmeasured"])
    assert measured["train_loss"] == unmeasured["train_loss"]
    assert not [k for k in unmeasured if k.startswith("comm_")]  # the study's instrument is opt-in
    logged = {k: logged_losses(runs[k]) for k in ("measured", "unmeasured")}
    assert len(logged["measured"]) >= 5 and logged["measured"] == logged["unmeasured"], logged  # each loss, in order


@pytest.mark.slow
@pytest.mark.torchrun
def test_switches_are_in_effect_and_training_still_learns(runs):
    plain, switched = results(runs["measured"]), results(runs["switches"])
    # read back from the wrapped model: the hook registered, DDP's bucket size
    assert switched["comm_ddp_comm_hook"] == "fp16_compress_hook" and switched["comm_ddp_bucket_cap_mb"] == 1
    # the calibration measured what travels: half the bytes, in fp16
    assert switched["comm_allreduce_dtype"] == "float16"
    assert switched["comm_allreduce_bytes"] == plain["comm_allreduce_bytes"] // 2
    # 16-bit gradients change the result a little, not the learning
    assert switched["train_loss"] != plain["train_loss"]
    assert switched["train_loss"] == pytest.approx(plain["train_loss"], rel=0.05)
    losses = logged_losses(runs["switches"])
    assert losses[-1] < 0.75 * losses[0] and all(map(math.isfinite, losses)), losses


@pytest.mark.slow
def test_single_process_records_no_measurement(tmp_path, tmp_path_factory):
    env = offline_env(tmp_path_factory)
    proc = run_qa([*TINY, "--do_train", "--max_steps", "2", "--save_strategy", "no", "--report_to", "none",
                   "--measure_communication", "true", "--output_dir", str(tmp_path)], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = results(tmp_path)
    assert not [k for k in r if k.startswith("comm_")]
    assert "communication" not in json.loads((tmp_path / "environment.json").read_text())
    assert r["train_grad_bytes"] == 4 * r["train_trainable_params"] and r["train_grad_dtype"] == "float32"
    assert r["train_setup"]["world_size"] == 1 and REPO.exists()


@pytest.mark.slow
@needs_compile
@pytest.mark.torchrun
@pytest.mark.compile
def test_measurement_reuses_the_training_graphs_under_compile(tmp_path, tmp_path_factory):
    """With torch.compile, a 2-process run that measures its communication compiles exactly the
    graphs one process compiles: the measured passes run in training mode, as training steps do
    (in evaluation mode they compiled graphs of their own and recompiled the training ones:
    measured, 5 graphs and 2 recompilations against 3 and 0)."""
    env = offline_env(tmp_path_factory)
    env["OMP_NUM_THREADS"] = "1"
    args = [*TINY, "--do_train", "--max_steps", "3", "--save_strategy", "no", "--report_to", "none",
            "--per_device_train_batch_size", "8", "--torch_compile", "true", "--compile_regional", "true",
            "--compile_dynamic", "true", "--ddp_find_unused_parameters", "false", "--measure_communication", "true"]
    compiled = {}
    for name, launcher in (("single", (sys.executable,)), ("ddp", TORCHRUN)):
        proc = run_qa([*args, "--output_dir", str(tmp_path / name)], env, launcher=launcher)
        assert proc.returncode == 0, proc.stderr[-3000:]
        compiled[name] = results(tmp_path / name)
    ddp, single = compiled["ddp"], compiled["single"]
    assert ddp["comm_world_size"] == 2 and ddp["comm_step_sync_s"] > 0  # the passes ran
    assert ddp["train_setup"]["compile"]["unique_graphs"] > 0
    for key in ("compiles", "unique_graphs", "recompiles"):
        assert ddp["train_setup"]["compile"][key] == single["train_setup"]["compile"][key], key
