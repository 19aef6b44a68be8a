"""A training step that never waits for the device. On a GPU the host queues work ahead of the device until
something needs a result the device has not produced yet: a tensor's value read on the host (item, bool, int,
float, tolist, numpy, cpu), an output whose size the data decide (nonzero, boolean indexing), a blocking copy to
the device, an explicit synchronize. Each such call in a training step idles the device while the host catches
up. configs/fast.json's switches run here on the CPU through run_qa.main (the project's callbacks, telemetry,
Trainer overrides and collator all active), and every such call in the steps that neither log, evaluate nor save
is listed with where it came from: none may come from the project; those of the Trainer, accelerate and
transformers' model code are compared with the list known for each supported release, so that an upgrade adding
one is noticed. Found so far: accelerate copies each tensor of a batch with non_blocking=False unless
accelerator_config {"non_blocking": true}, as fast.json has (with pinned memory, the copy then waits for
nothing); transformers' BERT evaluates padding_mask.all() on the host, to drop the mask when nothing is padded,
under eager and SDPA attention alike, unless the mask is always built, as the project's sdpa_with_mask does in
every compiled run (qa/training/compile.py; compilation itself is off here); logging_nan_inf_filter, off in
fast.json, reads the loss twice a step.

On a CPU nothing waits, so what would wait on a GPU is told by following the data: the model's parameters and
buffers, tensors moved or made on the device, and whatever is computed from them are device tensors; tensors
made from host data (the collator's batches before their copy, Python numbers) are host tensors, free to read.
A dispatch mode sees every operator with its inputs; what does not reach an operator on a CPU (tolist, numpy,
cpu, to, torch.tensor, factories given a device) is seen by wrapping it. Both places are "cpu" here, so a move
spelt "cpu" (or .cpu()) goes to the host, one to a device object to the device. Not seen: waits inside a
kernel (below the operators), code that runs only on CUDA or only with several processes."""
import json
import os
import subprocess
import sys
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary
from transformers import TrainerCallback

from tests.helpers import OLDEST, OLDEST_PYTHON, REPO, go_offline, needs_oldest

aten = torch.ops.aten
READ = "value read (item/bool/int/float)"
WAITS = {aten._local_scalar_dense.default: READ, aten.equal.default: "value read (equal)",
         # outputs whose size the data decide
         aten.nonzero.default: "nonzero", aten.masked_select.default: "masked_select",
         aten._unique2.default: "unique", aten.unique_consecutive.default: "unique", aten.unique_dim.default: "unique"}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
FACTORIES = ("zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint", "linspace")
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
THIS_FILE = os.path.abspath(__file__)
TO_DEVICE = "blocking copy to the device"

# configs/fast.json on a CPU: no TF32 or compilation here, the tiny model on generated data, one DataLoader worker
# (batches built in another process, as with fast.json's four), no TensorBoard (it acts in logging steps only).
# Of the 5 steps, 1, 2 and 5 neither log nor follow a log (3 logs); the first also starts the worker and the
# optimizer's state.
FAST_ON_CPU = [str(REPO / "configs" / "fast.json"), "--model_name_or_path", "bundled:tiny-bert",
               "--dataset_name", "synthetic", "--synthetic_train_examples", "24", "--max_seq_length", "64",
               "--doc_stride", "16", "--max_query_length", "16", "--per_device_train_batch_size", "4",
               "--max_steps", "5", "--logging_steps", "3", "--do_eval", "false", "--use_cpu", "true",
               "--tf32", "false", "--torch_compile", "false", "--dataloader_num_workers", "1",
               "--report_to", "none"]
BLOCKING = ["--accelerator_config", '{"non_blocking": false}']  # accelerate's default, not fast.json's

# What the Trainer, accelerate and transformers' model code do in each such step, by release:
# {(kind, file:function): calls per step}.
LIBRARY_SYNCS = {
    "5.23": {(READ, "transformers/masking_utils.py:_ignore_bidirectional_mask_sdpa"): 1},  # padding_mask.all()
}
LIBRARY_SYNCS["5.17"] = LIBRARY_SYNCS["5.23"]


def _spelt_cpu(device) -> bool:
    return isinstance(device, str) and device.split(":")[0] == "cpu"


class _Dispatch(TorchDispatchMode):
    def __init__(self, probe):
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        probe = self.probe
        device_in = any(probe.on_device(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        if func is aten.copy_.default:
            dst, src, non_blocking = args[0], args[1], args[2] if len(args) > 2 else kwargs.get("non_blocking")
            if probe.on_device(dst) != probe.on_device(src) and not non_blocking:
                probe.sync(TO_DEVICE if probe.on_device(dst) else "copy to the host")
            return func(*args, **kwargs)  # dst stays where it is
        if device_in:
            kind = WAITS.get(func)
            if func in INDEXING and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                                        for i in args[1]):
                kind = "boolean indexing"
            if kind:
                probe.sync(kind)
        out = func(*args, **kwargs)
        if device_in:
            probe.mark(*(t for t in tree_leaves(out) if isinstance(t, torch.Tensor)))
        return out


class HostSyncProbe(TrainerCallback):
    """Counts, per training step, the calls that would wait for a GPU (`steps`: {step: [(kind, site, ours)]}, for
    the steps that neither log, evaluate nor save, and follow one that does none of these either).
    `site`: the innermost frame outside torch; `ours`: the innermost project frame under Trainer.train, if any.
    Added last, so that the flags it reads at a step's end are final and the other callbacks' hooks fall inside."""

    def __init__(self):
        self._device = WeakIdKeyDictionary()
        self.steps, self._current, self._clean = {}, None, False
        self.wrappers = pytest.MonkeyPatch()  # for the training only: model loading breaks under some of them
        self._pid, self._thread = os.getpid(), threading.get_ident()

    def on_device(self, t) -> bool:
        return t in self._device

    def mark(self, *tensors):
        for t in tensors:
            self._device[t] = True

    def sync(self, kind):
        if self._current is not None and os.getpid() == self._pid and threading.get_ident() == self._thread:
            self._current.append((kind, *self._where()))

    @staticmethod
    def _where():
        site = ours = None
        frame = sys._getframe(2)
        while frame is not None:
            code, path = frame.f_code, os.path.abspath(frame.f_code.co_filename)
            # The probe's own frames are no site; the self-check's injected callback stands for project code.
            probe_frame = path == THIS_FILE and not code.co_qualname.startswith("InjectedRead")
            if not (path.startswith(TORCH_DIR) or probe_frame):
                library = "site-packages" in path
                label = (path.split("site-packages" + os.sep)[-1] if library else os.path.relpath(path, REPO))
                label = f"{label}:{code.co_name}:{frame.f_lineno}"
                site = site or label
                if library and code.co_name == "train" and label.startswith("transformers/trainer.py"):
                    break
                if not library and path.startswith(str(REPO)):
                    ours = ours or label
            frame = frame.f_back
        return site, ours

    # A step runs from the end of the previous one (or the epoch's start) to its own end: it fetches and copies its
    # batch first. The logging, evaluation and saving a step asks for come after its end, in the next one.
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.mark(*model.parameters(), *model.buffers())
        self._wrap(self.wrappers)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._current, self._clean = [], True

    def on_step_end(self, args, state, control, **kwargs):
        quiet = not (control.should_log or control.should_evaluate or control.should_save)
        if self._clean and quiet and self._current is not None:
            self.steps[state.global_step] = self._current
        self._current, self._clean = [], quiet

    def on_epoch_end(self, args, state, control, **kwargs):
        self._current = None

    def on_train_end(self, args, state, control, **kwargs):
        self._current = None
        self.wrappers.undo()

    def _wrap(self, monkeypatch):
        probe, T = self, torch.Tensor

        def reading(name):
            original = getattr(T, name)

            def read(t, *args, **kwargs):
                if probe.on_device(t):
                    probe.sync(f"copy to the host ({name})")
                return original(t, *args, **kwargs)
            return read

        def moving(t, *args, **kwargs):
            device, _, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
            out = to(t, *args, **kwargs)
            if device is None:
                return out  # a dtype's change stays where it is: the dispatch mode follows it
            target = kwargs.get("device", args[0] if args else None)
            host_target = _spelt_cpu(target) or isinstance(target, T) and not probe.on_device(target)
            if probe.on_device(t) == host_target:  # it crosses between host and device
                if not non_blocking:
                    probe.sync("copy to the host (to)" if host_target else TO_DEVICE)
                out = out.clone() if out is t else out  # a copy, as on a GPU: the original stays where it was
                if host_target:
                    probe._device.pop(out, None)
                else:
                    probe.mark(out)
            return out

        def to_host(t, *args, **kwargs):
            return moving(t, "cpu", *args, **kwargs)

        def made(original, copies):
            def make(*args, device=None, **kwargs):
                out = original(*args, device=device, **kwargs)
                if device is None or _spelt_cpu(device) or probe.on_device(out):
                    return out
                if copies:  # from Python data or a host tensor: a copy the host waits for
                    probe.sync(f"{TO_DEVICE} (torch.{original.__name__})")
                elif sys._getframe(1).f_code.co_filename.startswith(TORCH_DIR):
                    return out  # torch's own: e.g. a DataLoader worker's batch rebuilt where it lies, on the host
                probe.mark(out)
                return out
            return make

        def synchronize(*args, **kwargs):
            probe.sync("synchronize")

        to = T.to
        for name in ("tolist", "numpy"):
            monkeypatch.setattr(T, name, reading(name))
        monkeypatch.setattr(T, "to", moving)
        monkeypatch.setattr(T, "cpu", to_host)
        for name in ("tensor", "as_tensor"):
            monkeypatch.setattr(torch, name, made(getattr(torch, name), copies=True))
        for name in FACTORIES:
            monkeypatch.setattr(torch, name, made(getattr(torch, name), copies=False))
        for owner in (torch.cuda, torch.accelerator, torch.cuda.Event, torch.cuda.Stream):
            monkeypatch.setattr(owner, "synchronize", synchronize)

    def table(self) -> dict:
        """The calls no project code made: {(kind, file:function): [calls per step, lines]}."""
        out = {}
        for calls in self.steps.values():
            for kind, site, _ in (call for call in calls if not call[2]):
                where, line = site.rsplit(":", 1)
                entry = out.setdefault((kind, where), [0, set()])
                entry[0] += 1
                entry[1].add(int(line))
        return {key: [count / max(len(self.steps), 1), sorted(lines)] for key, (count, lines) in out.items()}

    def ours(self) -> list:
        return [list(call) for call in sorted({(kind, ours) for calls in self.steps.values()
                                               for kind, _, ours in calls if ours})]


class InjectedRead(TrainerCallback):
    """A callback that reads a device value (the probe must catch it) and host values (it must not)."""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        host = torch.tensor([1.0, 2.0])
        host.sum().item(), host.tolist(), host.cpu(), host.numpy()
        next(model.parameters()).sum().item()


class MaskAlways(TrainerCallback):
    """What a compiled run does to its model (qa/model.py), without compiling: the attention mask always built."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from qa.training.compile import keep_mask_when_compiled

        keep_mask_when_compiled(model)


def measure(tmp, extra=(), callbacks=()) -> dict:
    """run_qa.main on configs/fast.json's switches under the probe (`extra`: more flags): what it found."""
    import transformers

    from run_qa import main

    probe = HostSyncProbe()
    with pytest.MonkeyPatch.context() as monkeypatch:
        go_offline(monkeypatch, f"{tmp}/hf", drop=("TENSORBOARD_LOGGING_DIR",))
        try:
            with _Dispatch(probe):
                status = main([*FAST_ON_CPU, *extra, "--output_dir", f"{tmp}/out"], callbacks=(*callbacks, probe))
        finally:
            probe.wrappers.undo()
    assert status == 0
    return {"version": transformers.__version__, "steps": sorted(probe.steps),
            "libraries": [[*key, *value] for key, value in sorted(probe.table().items())], "ours": probe.ours()}


def _check(found):
    release = ".".join(found["version"].split(".")[:2])
    print(f"transformers {found['version']}, steps {found['steps']}: calls that wait for the device, per step")
    for kind, where, per_step, lines in found["libraries"]:
        print(f"  {per_step:g} x {kind}: {where} (line {', '.join(map(str, lines))})")
    assert found["steps"] == [1, 2, 5]
    assert found["ours"] == [], f"the project's code waits for the device in a training step: {found['ours']}"
    assert {(kind, where): per_step for kind, where, per_step, _ in found["libraries"]} == LIBRARY_SYNCS[release]


def test_no_project_code_waits_for_the_device_in_a_training_step(tmp_path):
    _check(measure(str(tmp_path)))


def test_the_probe_catches_a_read_and_the_settings_change_what_waits(tmp_path):
    """An injected read of a parameter is found at its line, host reads beside it are not; blocking copies (fast.json
    turns them off) wait for each tensor of the batch; logging_nan_inf_filter (fast.json turns it off) twice a step."""
    found = measure(str(tmp_path), [*BLOCKING, "--logging_nan_inf_filter", "true"], [InjectedRead()])
    line = InjectedRead.on_step_end.__code__.co_firstlineno + 3
    assert found["ours"] == [[READ, f"tests/test_host_sync.py:on_step_end:{line}"]]
    libraries = {(kind, where.split(":")[0]): per_step for kind, where, per_step, _ in found["libraries"]}
    assert libraries == {(TO_DEVICE, "accelerate/utils/operations.py"): 5, (READ, "transformers/masking_utils.py"): 1,
                         (READ, "transformers/trainer.py"): 2}, found


def test_the_compiled_runs_mask_and_non_blocking_copies_leave_nothing_to_wait_for(tmp_path):
    """fast.json as it runs on a GPU, but for compilation: with the mask always built (and the batch copied
    without blocking), no call in a quiet training step waits for the device; nor with static shapes (fixed widths,
    the epoch's last batch, 3 features at step 17, filled with ignored rows the telemetry leaves out)."""
    static = ["--length_buckets", "32", "64", "--max_steps", "-1", "--num_train_epochs", "1"]
    found = measure(str(tmp_path), static, [MaskAlways()])
    assert found["steps"] == [1, 2, 5, 8, 11, 14, 17] and found["ours"] == [] and found["libraries"] == [], found


@needs_oldest
def test_the_oldest_release_waits_only_where_known(tmp_path):
    code = f"import json; from tests.test_host_sync import measure; print(json.dumps(measure({str(tmp_path)!r})))"
    proc = subprocess.run([OLDEST_PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["version"].startswith(OLDEST + ".")
    _check(found)
