"""Throughput telemetry: the formulas on hand-made numbers, the callback on hand-made batches,
and a real tiny run that must log train/perf/* to TensorBoard and summarise them in
all_results.json. No timing asserts: only that the figures exist and are sane.

`tiny_run` (tests/helpers.py) is shared with tests/test_profiling.py and tests/test_plot_tb.py, so each tiny run
(about 10 s of imports alone) happens once per test session."""
import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.helpers import PLAIN, REPO, bench_module, scalars, tiny_run


# ---------------------------------------------------------------------------------------------
# Formulas


def test_train_throughput_counts_real_tokens_from_the_masks():
    from datasets import Dataset

    from qa.training.telemetry import train_throughput

    features = Dataset.from_dict({"attention_mask": [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0]]})
    features = features.select([0, 1, 2])  # a selection: the masks' totals must follow it, not the whole table
    extra = train_throughput({"train_samples_per_second": 10.0}, features, 2)
    assert extra == {"train_examples": 2, "train_features": 3, "train_mean_real_tokens": 3.0,
                     "train_features_padding_fraction": 0.25, "train_real_tokens_per_second": 30.0}


def test_elementary_formulas():
    from qa.training.flops import mfu
    from qa.training.telemetry import gib, padding_fraction, rate, share

    assert rate(10, 4) == 2.5 and rate(10, 0) is None
    assert share(1, 4) == 0.25 and share(5, 4) == 1.0 and share(-1, 4) == 0.0 and share(1, 0) is None
    assert padding_fraction(75, 100) == 0.25 and padding_fraction(0, 0) is None
    assert gib(3 * 2 ** 30) == 3.0 and gib(None) is None
    assert mfu(6e12, 2.0, 10e12) == 0.3 and mfu(6e12, 2.0, None) is None and mfu(1, 0, 1e12) is None


def test_flops_formulas():
    from qa.training.flops import model_flops

    def flops_per_token(n, layers, hidden, seq_len):  # PaLM's 6N + 12 L H s
        return 6 * n + 12 * layers * hidden * seq_len

    # bert-base: 85M non-embedding parameters, 12 layers, hidden 768, one sequence of 384 tokens
    assert model_flops(85_000_000, 12, 768, 384, 384 ** 2) == 384 * flops_per_token(85_000_000, 12, 768, 384)
    # two sequences of 3 and 5 real tokens: per-token formula summed over their tokens
    n, layers, hidden = 100, 2, 4
    expected = 3 * flops_per_token(n, layers, hidden, 3) + 5 * flops_per_token(n, layers, hidden, 5)
    assert model_flops(n, layers, hidden, real_tokens=8, sum_sq_lengths=9 + 25) == expected


def test_peak_table():
    from qa.training.flops import peak_flops

    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == (312e12, "A100 bf16 dense")
    assert peak_flops("NVIDIA A100-PCIE-40GB", "fp32")[0] == 19.5e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16")[0] == 989e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16")[0] == 756e12
    assert peak_flops("NVIDIA H200", "tf32")[0] == 494e12
    assert peak_flops("NVIDIA L40S", "bf16")[0] == 362e12
    assert peak_flops("NVIDIA L4", "fp16")[0] == 121e12
    assert peak_flops("Tesla V100-SXM2-32GB", "fp16")[0] == 125e12
    value, why = peak_flops("Tesla V100-SXM2-32GB", "bf16")
    assert value is None and "bf16" in why  # V100 has no bf16 tensor cores
    value, why = peak_flops(None, "fp32")
    assert value is None and "--peak_tflops" in why  # CPU: MFU null unless given
    assert peak_flops(None, "fp32", override_tflops=2.5) == (2.5e12, "--peak_tflops 2.5")
    value, why = peak_flops("Some Future GPU", "bf16")
    assert value is None and "Some Future GPU" in why and "--peak_tflops" in why


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                                  "NVIDIA H200 MIG 7g.141gb"])
def test_a_mig_slice_has_no_peak(name):
    """A MIG slice has a fraction of the card's units: the full card's peak would make its MFU
    look several times lower than it is. Null, with the reason, unless --peak_tflops is given."""
    from qa.training.flops import peak_flops

    value, why = peak_flops(name, "bf16")
    assert value is None and "MIG slice" in why and "--peak_tflops" in why
    assert peak_flops(name, "bf16", override_tflops=140) == (140e12, "--peak_tflops 140")


def test_matmul_precision():
    from qa.training.flops import matmul_precision

    assert matmul_precision(bf16=True) == "bf16" and matmul_precision(fp16=True) == "fp16"
    assert matmul_precision(tf32=True) == "tf32" and matmul_precision(tf32=False) == "fp32"


TF32_READINGS = """
import json, sys, torch
from transformers.utils.import_utils import enable_tf32
from qa.training.flops import matmul_precision, settle_tf32
enable_tf32(sys.argv[1] == "on")  # how TrainingArguments(tf32=...) sets it in transformers 5.17 and later
before = {}
try:
    torch.backends.cuda.matmul.allow_tf32
except RuntimeError as err:
    before["legacy"] = str(err)[:40]
settled = settle_tf32()
print(json.dumps({"before": before, "settled": settled, "legacy_matmul": torch.backends.cuda.matmul.allow_tf32,
                  "legacy_cudnn": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.fp32_precision,
                  "cudnn_conv": torch.backends.cudnn.conv.fp32_precision,
                  "matmul_precision": torch.get_float32_matmul_precision(), "recorded": matmul_precision()}))
"""


@pytest.mark.parametrize("state", ["on", "off"])
def test_settle_tf32_leaves_a_state_both_apis_read(state):
    """transformers sets TF32 through torch's newer API alone, after which torch refuses to read the legacy flag
    that inductor reads while compiling (the compile then falls back). settle_tf32 keeps the setting and makes
    every reading answer, and agree."""
    done = subprocess.run([sys.executable, "-c", TF32_READINGS, state], cwd=REPO, capture_output=True, text=True,
                          check=True)
    r = json.loads(done.stdout)
    on = state == "on"
    if on:
        assert "legacy" in r["before"]  # the fault this guards against, still there in the installed torch
    assert r["settled"] is on and r["legacy_matmul"] is on and r["legacy_cudnn"] is on
    assert r["matmul"] == r["cudnn_conv"] == ("tf32" if on else "ieee")
    assert r["matmul_precision"] == ("high" if on else "highest")
    assert r["recorded"] == ("tf32" if on else "fp32")


def test_perf_metrics():
    from qa.training.telemetry import perf_metrics

    perf = perf_metrics(steps=4, samples=64, real_tokens=600, batch_tokens=800, flops=3e12, step_s=3.0,
                        data_s=1.0, peak_flops_per_s=1e12, world_size=2)
    assert perf["step_time_s"] == 0.75
    assert perf["samples_per_s"] == 64 / 4 * 2 and perf["real_tokens_per_s"] == 600 / 4 * 2
    assert perf["padding_fraction"] == 0.25 and perf["data_time_share"] == 0.25
    assert perf["tflops_per_device"] == 0.75 and perf["mfu"] == 0.75
    empty = perf_metrics(steps=0, samples=0, real_tokens=0, batch_tokens=0, flops=0, step_s=0.0, data_s=0.0)
    assert all(v is None for v in empty.values()), empty


def test_model_shape_skips_embeddings():
    import torch

    from qa.training.flops import model_shape

    model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 4))
    model.config = SimpleNamespace(num_hidden_layers=3, hidden_size=8)
    assert model_shape(model) == {"non_embedding_params": 8 * 4 + 4, "layers": 3, "hidden": 8}


# ---------------------------------------------------------------------------------------------
# The callback on hand-made batches (no Trainer)


class _Tiny:
    def __init__(self):
        import torch

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(2, 2)
                self.config = SimpleNamespace(num_hidden_layers=1, hidden_size=2, pad_token_id=0)

            def forward(self, input_ids=None, attention_mask=None):
                return input_ids

        self.model = M()
        self.args = SimpleNamespace(device=torch.device("cpu"), bf16=False, fp16=False, tf32=False, world_size=1,
                                    torch_compile=False, per_device_train_batch_size=2, gradient_accumulation_steps=1)
        self.state = SimpleNamespace(log_history=[], global_step=0)

    def step(self, callback, control=None):
        """One optimizer step, as the Trainer signals it to `callback`, without a batch."""
        callback.on_step_begin(self.args, self.state, control)
        self.state.global_step += 1
        callback.on_step_end(self.args, self.state, control)


def test_callback_counts_the_batches_the_model_sees():
    import torch

    from qa.training.telemetry import TelemetryCallback

    t = _Tiny()
    cb = TelemetryCallback(peak_tflops=1.0)
    cb.on_train_begin(t.args, t.state, None, model=t.model)
    batches = [torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]), torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])]
    for mask in batches:
        cb.on_step_begin(t.args, t.state, None)
        t.model(input_ids=mask * 5, attention_mask=mask)
        t.state.global_step += 1
        cb.on_step_end(t.args, t.state, None)
    t.model.eval()
    t.model(input_ids=batches[0], attention_mask=batches[0])  # evaluation batches do not count
    t.model.train()
    assert cb.log_values({"eval_loss": 1.0}) == {}  # only entries of the training loss get them
    logs = cb.log_values({"loss": 1.0})
    assert logs["perf/padding_fraction"] == 0.375  # 10 real tokens in 16 positions
    assert logs["perf/step_time_s"] >= 0 and 0 <= logs["perf/data_time_share"] <= 1
    assert logs["perf/samples_per_s"] > 0 and logs["perf/real_tokens_per_s"] > 0 and logs["perf/mfu"] > 0
    assert cb.log_values({"loss": 1.0}) == {}  # no step since the last entry
    cb.on_step_begin(t.args, t.state, None)
    t.model(input_ids=torch.tensor([[7, 7, 0, 0]]), attention_mask=torch.tensor([[1, 1, 0, 0]]))
    cb.on_step_end(t.args, t.state, None)
    cb.on_train_end(t.args, t.state, None)
    summary = cb.summary()
    assert summary["train_real_tokens_batches"] == 12
    assert summary["train_batches_padding_fraction"] == 0.4  # 12 real tokens in 20 positions
    # model FLOPs: 6 x 6 params x 12 tokens + 12 x 1 layer x 2 hidden x (3²+2²+4²+1²+2²)
    assert summary["train_model_flops"] == 6 * 6 * 12 + 12 * 1 * 2 * (9 + 4 + 16 + 1 + 4)
    assert summary["train_peak_tflops"] == 1.0 and summary["train_peak_memory_gib"] is None
    assert t.model._forward_pre_hooks == {}  # removed at train end


def test_passes_outside_the_optimizer_steps_are_not_counted():
    """Other callbacks (the compile warm-up, the scaling study's measurement) run training-mode
    passes before the first step, on the telemetry's hook but off its clock: not counted."""
    import torch

    from qa.training.telemetry import TelemetryCallback

    t = _Tiny()
    cb = TelemetryCallback(peak_tflops=1.0)
    cb.on_train_begin(t.args, t.state, None, model=t.model)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    t.model(input_ids=mask * 5, attention_mask=mask)  # a trial pass before the first step
    cb.on_step_begin(t.args, t.state, None)
    t.model(input_ids=mask[:1] * 5, attention_mask=mask[:1])
    t.state.global_step += 1
    cb.on_step_end(t.args, t.state, None)
    t.model(input_ids=mask * 5, attention_mask=mask)  # and one between steps
    cb.on_train_end(t.args, t.state, None)
    summary = cb.summary()
    assert summary["train_real_tokens_batches"] == 4 and summary["train_batches_padding_fraction"] == 0.0

def _windowed(t, start, stop, min_s=0.0, telemetry=True):
    """bench/timed_run.py's TimedWindow installed as run_qa installs it, after the run's telemetry (when on);
    `step(control=None, mask=None)` runs one optimizer step through both, a batch of `mask` if given."""
    import torch
    from transformers import TrainerControl

    from qa.training.telemetry import TelemetryCallback

    cb = TelemetryCallback(peak_tflops=1.0) if telemetry else None
    window = bench_module("timed_run").TimedWindow(start, stop, min_s, file="bench_window.json")
    window.bind(SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[cb] if cb else [])))
    callbacks = [c for c in (cb, window) if c]
    t.args.output_dir, t.state.is_world_process_zero = t.out, True
    if cb:
        cb.on_train_begin(t.args, t.state, None, model=t.model)

    def step(control=None, mask=None):
        control = control or TrainerControl()
        for c in callbacks:
            c.on_step_begin(t.args, t.state, control)
        if mask is not None:
            t.model(input_ids=torch.tensor(mask), attention_mask=torch.tensor(mask))
        t.state.global_step += 1
        for c in callbacks:
            c.on_step_end(t.args, t.state, control)
        return control
    return cb, window, step


def test_timed_window_counts_only_its_steps(tmp_path):
    """The benchmark's window (bench/timed_run.py) reads the telemetry's counts at its edges: steps 3 and 4 of
    five, training stopped at its close, its figures in bench_window.json; the run's telemetry counts every step."""
    t = _Tiny()
    t.out = tmp_path
    cb, window, step = _windowed(t, 2, 4)
    masks = [[[1, 1, 0, 0]], [[1, 0, 0, 0]], [[1, 1, 1, 0]], [[1, 1, 1, 1], [1, 1, 0, 0]], [[1, 0, 0, 0]]]
    stopped = [step(mask=mask).should_training_stop for mask in masks]  # steps 1..5
    assert stopped == [False, False, False, True, False]  # the Trainer stops at the close; here step 5 runs on
    cb.on_train_end(t.args, t.state, None)
    s = json.loads((tmp_path / "bench_window.json").read_text())
    assert s == window.record and "train_window_complete" not in cb.summary()
    assert (s["train_window_first_step"], s["train_window_last_step"], s["train_window_min_s"]) == (3, 4, None)
    assert s["train_window_steps"] == 2 and s["train_window_samples"] == 3
    assert s["train_window_real_tokens"] == 3 + 4 + 2 and s["train_window_batch_tokens"] == 12
    assert s["train_window_sum_sq_lengths"] == 9 + 16 + 4
    assert s["train_window_padding_fraction"] == 0.25
    assert s["train_window_seconds"] > 0 and s["train_window_warmup_s"] > 0 and s["train_first_step_s"] > 0
    assert s["train_window_samples_per_second"] == pytest.approx(3 / s["train_window_seconds"], rel=1e-3)
    assert s["train_window_mfu"] > 0 and s["train_window_peak_rss_gib"] > 0 and s["train_window_compiles"] == 0
    assert cb.summary()["train_real_tokens_batches"] == 2 + 1 + 9 + 1  # the whole run still counts every step
    # without the telemetry: the window's own steps, seconds and compilations, no counts
    t.state.global_step = 0
    _, bare, step = _windowed(t, 1, 2, telemetry=False)
    step(), step()
    assert bare.record["train_window_steps"] == 1 and bare.record["train_window_seconds"] > 0
    assert "train_window_samples" not in bare.record and bare.record["train_window_compiles"] == 0


def test_timed_window_counts_the_compilations_inside_it(tmp_path):
    """torch's counters, read at both ends of the window: a function compiled (and recompiled
    for a new input kind) inside the window is counted, one compiled before it is not."""
    import torch

    from qa.training.compile import compile_stats

    @torch.compile(backend="eager")  # dynamo's part only: no code generation, a fraction of a second
    def double(x):
        return x * 2

    compile_stats()  # the counting hook in place, as after an earlier run in this process ...
    torch._dynamo.reset()  # ... and cleared with every compile callback (tests and notebooks call it)
    t = _Tiny()
    t.out = tmp_path
    _, window, step = _windowed(t, 2, 4)
    for n in range(1, 6):
        if n == 1:
            double(torch.ones(3))  # compiled before the window
        if n == 3:
            double(torch.ones(3))  # a graph it has: nothing compiled
            double(torch.ones(3, dtype=torch.int64))  # another dtype: its guards fail, a recompile
        step()
    s = window.record
    assert s["train_window_compiles"] == 1 and s["train_window_recompiles"] == 1 and s["train_window_new_graphs"] == 1
    t.state.global_step = 0
    _, before, step = _windowed(t, 3, 4)
    for n in range(1, 5):
        if n == 2:
            double(torch.ones(2, 2))  # a new shape, before the window
        step()
    assert before.record["train_window_compiles"] == 0


def test_timed_window_with_a_minimum_duration_stays_open_past_its_last_step(tmp_path):
    """A window that has not lasted MIN_S seconds at STOP stays open, then closes and stops training at the end of
    the first step after that; training that ends before it closes leaves no bench_window.json."""
    import time

    from transformers import TrainerControl

    t = _Tiny()
    t.out = tmp_path / "long"
    _, window, step = _windowed(t, 1, 2, min_s=0.25)
    control = TrainerControl()
    while not control.should_training_stop and t.state.global_step < 100:
        time.sleep(0.05)
        step(control)
    s = json.loads((t.out / "bench_window.json").read_text())
    assert s["train_window_min_s"] == 0.25 and s["train_window_seconds"] >= 0.25
    assert s["train_window_last_step"] == t.state.global_step > 2 and s["train_window_steps"] == t.state.global_step - 1
    t.out, t.state.global_step = tmp_path / "early", 0
    _, early, step = _windowed(t, 1, 2, min_s=60)
    assert not any(step().should_training_stop for _ in range(3))
    assert early.record.keys() == {"train_first_step_s"} and not (tmp_path / "early" / "bench_window.json").exists()


def test_a_bad_window_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "timed_run.py"), "5:5", "--output_dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error: bench/timed_run.py '5:5': must be START:STOP")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Fix: give e.g. 10:50" in proc.stderr


def test_clock_starts_at_the_first_step():
    """What runs when training begins (another callback's passes, the DataLoader's start-up) is
    neither step nor data time, whatever the callbacks' order."""
    import time

    from qa.training.telemetry import TelemetryCallback

    t = _Tiny()
    cb = TelemetryCallback()
    cb.on_train_begin(t.args, t.state, None, model=t.model)
    time.sleep(0.3)  # before the first step
    for _ in range(2):
        t.step(cb)
    cb.on_train_end(t.args, t.state, None)
    s = cb.summary()
    assert s["train_data_time_total_s"] < 0.1 and s["train_step_time_total_s"] < 0.1


def test_run_callbacks_follow_the_arguments():
    from qa.arguments import RunArguments
    from qa.distributed import DDPCompressionHook
    from qa.evaluation.time_to_accuracy import TimeToAccuracyCallback
    from qa.training.callbacks import run_callbacks
    from qa.training.preemption import CheckpointOnSignalCallback
    from qa.training.profiling import ProfilerCallback
    from qa.training.telemetry import TelemetryCallback
    from qa.training.compile import CompileWarmupCallback

    training_args = SimpleNamespace(output_dir="x", report_to=[])
    kinds = {k: type(c) for k, c in run_callbacks(RunArguments(profile=True), training_args).items()}
    assert kinds == {"telemetry": TelemetryCallback, "profiler": ProfilerCallback,
                     "preemption": CheckpointOnSignalCallback}
    compiled = run_callbacks(RunArguments(compile_warmup=True, preemption_check_steps=4, eval_every=0.5),
                             SimpleNamespace(output_dir="x", torch_compile=True, torch_compile_mode=None, report_to=[]))
    assert [type(c) for c in compiled.values()] == [TimeToAccuracyCallback, TelemetryCallback,
                                                    CheckpointOnSignalCallback, CompileWarmupCallback]
    assert compiled["preemption"].check_steps == 4 and compiled["compile_warmup"].passes == 1
    graphs = SimpleNamespace(output_dir="x", torch_compile=True, torch_compile_mode="reduce-overhead", report_to=[])
    assert run_callbacks(RunArguments(compile_warmup=True), graphs)["compile_warmup"].passes == 2  # CUDA graphs record
    uncompiled = run_callbacks(RunArguments(compile_warmup=True), SimpleNamespace(output_dir="x", torch_compile=False))
    assert "compile_warmup" not in uncompiled  # nothing to warm up
    # every instrument off, and nothing of the scaling study's unless asked (--measure_communication)
    assert run_callbacks(RunArguments(telemetry=False, checkpoint_on_sigterm=False), training_args) == {}
    hook = run_callbacks(RunArguments(ddp_comm_hook="fp16"), training_args)["ddp_comm_hook"]
    assert isinstance(hook, DDPCompressionHook) and hook.name == "fp16"
    # their values are checked with every other setting, by qa.arguments' rules, right after parsing
    from qa.errors import InputError
    from qa.arguments import check_settings

    for bad, culprit in (({"profile_active": 0}, "profile_active=0"), ({"peak_tflops": -1}, "peak_tflops=-1")):
        with pytest.raises(InputError, match=f"^{culprit}: must be"):
            check_settings(bad)


def test_callbacks_are_installed_through_the_public_api():
    """After the Trainer's own callbacks (flow, reporting), the console's log printer in place of
    the Trainer's (qa.console) unless --log_lines false; no reordering, no frame walking."""
    import inspect

    from transformers import PrinterCallback, ProgressCallback, Trainer, TrainingArguments
    from transformers.integrations import TensorBoardCallback

    import qa.training.callbacks
    from qa.arguments import RunArguments
    from qa.console import LogLinesCallback, LogLinesProgressCallback
    from qa.training.callbacks import TensorBoardEvents, install, run_callbacks, summary

    assert "_getframe" not in inspect.getsource(qa.training.callbacks)
    args = TrainingArguments(output_dir="x", use_cpu=True, report_to=["tensorboard"])
    for log_lines in (True, False):
        trainer = Trainer(model=_Tiny().model, args=args)
        before = list(trainer.callback_handler.callbacks)
        assert any(isinstance(c, TensorBoardCallback) for c in before)
        run_args = RunArguments(profile=True, log_lines=log_lines)
        callbacks = list(run_callbacks(run_args, args).values())
        install(trainer, callbacks, run_args)
        printer = [c for c in before if isinstance(c, (ProgressCallback, PrinterCallback))]
        assert len(printer) == 1
        # the Trainer's TensorBoard callback is replaced by the one whose full disk is one line
        events = [c for c in trainer.callback_handler.callbacks if isinstance(c, TensorBoardEvents)]
        assert len(events) == 1 and not any(type(c) is TensorBoardCallback for c in trainer.callback_handler.callbacks)
        now = [c for c in trainer.callback_handler.callbacks if c is not events[0]]
        before = [c for c in before if not isinstance(c, TensorBoardCallback)]
        if log_lines:
            kept = [c for c in before if c is not printer[0]]
            assert now[:len(kept)] == kept and isinstance(now[len(kept)], (LogLinesCallback, LogLinesProgressCallback))
            assert now[len(kept) + 1:] == callbacks
        else:
            assert now == before + callbacks
    assert summary(callbacks) == {}  # nothing measured yet


# ---------------------------------------------------------------------------------------------
# A real run

PERF_TAGS = ("step_time_s", "samples_per_s", "real_tokens_per_s", "padding_fraction", "data_time_share",
             "tflops_per_device", "mfu", "peak_rss_gib")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return tiny_run(tmp_path_factory, *PLAIN)


def test_perf_scalars_in_tensorboard(plain):
    found = scalars(plain)
    for tag in PERF_TAGS:
        values = found.get(f"train/perf/{tag}")
        assert values and all(math.isfinite(v) for v in values), (tag, sorted(found))
    assert len(found["train/perf/samples_per_s"]) == len(found["train/loss"])  # every logging step
    assert all(0 <= v < 1 for v in found["train/perf/padding_fraction"])
    assert all(0 <= v <= 1 for v in found["train/perf/data_time_share"])
    assert all(v > 0 for v in found["train/perf/real_tokens_per_s"] + found["train/perf/samples_per_s"])
    assert "train/perf/peak_mem_gib" not in found  # no GPU here


def test_perf_summary_in_results(plain):
    res = json.loads((plain / "all_results.json").read_text())
    assert res == {**json.loads((plain / "train_results.json").read_text()), **res}
    assert 0 <= res["train_batches_padding_fraction"] < 1
    # features padded to max_seq_length: the batches' padding is the features' padding
    assert res["train_batches_padding_fraction"] == pytest.approx(res["train_features_padding_fraction"], abs=1e-4)
    assert 0 <= res["train_data_loading_share"] <= 1
    assert res["train_step_time_mean_s"] > 0 and res["train_real_tokens_per_second_measured"] > 0
    # one epoch: every feature once (train_mean_real_tokens is rounded to 2 decimals)
    assert abs(res["train_real_tokens_batches"] - res["train_mean_real_tokens"] * res["train_features"]) \
        <= 0.005 * res["train_features"]
    assert res["train_model_flops"] > 0 and res["train_tflops_per_device"] > 0
    assert res["train_mfu"] == pytest.approx(res["train_tflops_per_device"] / 0.5, rel=1e-2)
    assert res["train_peak_tflops_source"] == "--peak_tflops 0.5"
    assert res["train_peak_memory_gib"] is None and res["train_peak_rss_gib"] > 0  # CPU
    assert "MFU" in (plain / "results.md").read_text()
    log = json.loads((plain / "trainer_state.json").read_text())["log_history"]
    assert all("perf/samples_per_s" in entry for entry in log if "loss" in entry)
