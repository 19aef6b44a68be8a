"""torch.profiler on process zero over a bounded schedule, as the recorded steps are slower (docs/telemetry.md,
"Profiling a few steps"); profile.json adds the share of the recorded steps' wall time the GPU was busy, and what
the host waited for in them."""
import json
import logging
from pathlib import Path

from transformers import TrainerCallback

from qa.io import atomic_write_json, atomic_write_text, optional_output, replacing
from qa.training.telemetry import max_rss_gib

logger = logging.getLogger(__name__)
PROFILE_DIR = "profile"


class ProfilerCallback(TrainerCallback):
    def __init__(self, output_dir, wait=1, warmup=1, active=3, repeat=1, with_stack=False, row_limit=40):
        self.dir = Path(output_dir) / PROFILE_DIR
        self.wait, self.warmup, self.active, self.repeat = wait, warmup, active, repeat
        self.with_stack, self.row_limit = with_stack, row_limit
        self.prof, self._cuda, self.stopped = None, False, False  # stopped: by a full disk (qa.io.optional_output)
        self.cycles = []  # [{"cycle": k, "global_steps": [...], "files": [...]}]
        self._recording = []  # global steps recorded in the current cycle

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self._cuda = torch.cuda.is_available() and getattr(args.device, "type", "") == "cuda"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.prof = profile(
            activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self._cuda else []),
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=self.repeat),
            on_trace_ready=self._write, record_shapes=True, profile_memory=True, with_stack=self.with_stack)
        self.prof.start()
        logger.info("profiling steps %d..%d of each %d-step cycle (%s cycles) into %s",
                    self.wait + self.warmup + 1, self.wait + self.warmup + self.active,
                    self.wait + self.warmup + self.active, self.repeat or "all", self.dir)

    def on_step_end(self, args, state, control, **kwargs):
        if self.prof is None:
            return
        from torch.profiler import ProfilerAction

        if self.prof.current_action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self._recording.append(state.global_step)  # the step that just ended was recorded
        self.prof.step()  # writes a cycle's files after its last active step; records nothing after `repeat` cycles

    def on_train_end(self, args, state, control, **kwargs):
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.stop()  # a cycle cut short by the end of training still writes what it recorded
        if not self.cycles:
            logger.warning("profiling: training ended after %d steps, before the first recorded step "
                           "(--profile_wait %d + --profile_warmup %d); nothing was written",
                           state.global_step, self.wait, self.warmup)

    def summary(self) -> dict:
        if not self.cycles:
            return {}
        return {"train_profiled_steps": [s for c in self.cycles for s in c["global_steps"]],
                "train_profile_dir": str(self.dir),
                "train_profile_device_busy_share": self.cycles[0]["device_busy"]["share"],
                "train_profile_host_waits": self.cycles[0]["host_waits"]}

    def _write(self, prof):
        if not self.stopped:
            with optional_output(self.dir, "the profile") as said:
                self._write_files(prof)
            self.stopped = said.stopped

    def _write_files(self, prof):
        import torch

        k = len(self.cycles) + 1
        suffix = "" if k == 1 else f"-cycle{k}"
        steps, self._recording = self._recording, []
        averages = prof.key_averages()
        device_sort = "self_device_time_total" if self._cuda else "self_cpu_time_total"
        files = {"operators": f"operators{suffix}.txt", "trace": f"trace{suffix}.json", "memory": f"memory{suffix}.txt"}
        header = (f"torch.profiler, training steps {steps} (global step numbers), "
                  f"{'CPU + CUDA' if self._cuda else 'CPU only'}; sorted by {device_sort}\n\n")
        atomic_write_text(self.dir / files["operators"],
                          header + averages.table(sort_by=device_sort, row_limit=self.row_limit) + "\n")
        with replacing(self.dir / files["trace"]) as tmp:
            prof.export_chrome_trace(tmp)

        mem_sort = "self_device_memory_usage" if self._cuda else "self_cpu_memory_usage"
        lines = [f"Memory of training steps {steps}", "", f"process peak RSS (host memory): {max_rss_gib():.3f} GiB",
                 "", f"Operators by the memory they allocate themselves ({mem_sort}; negative: freed):", "",
                 averages.table(sort_by=mem_sort, row_limit=self.row_limit)]
        if self._cuda:  # its peak allocated and reserved included
            lines += ["", "torch.cuda.memory_summary():", "", torch.cuda.memory_summary()]
        atomic_write_text(self.dir / files["memory"], "\n".join(lines) + "\n")

        trace = json.loads((self.dir / files["trace"]).read_text())
        self.cycles.append({"cycle": k, "global_steps": steps, "files": files, "device_busy": device_busy(trace),
                            "host_waits": host_waits(trace)})
        atomic_write_json(self.dir / "profile.json", {
            "schedule": {"wait": self.wait, "warmup": self.warmup, "active": self.active, "repeat": self.repeat},
            "device": torch.cuda.get_device_name() if self._cuda else "cpu",
            "cycles": self.cycles,
            "open_trace_in": "https://ui.perfetto.dev or chrome://tracing"})
        logger.info("profiling: steps %s written to %s", steps, self.dir)


# Device activity in a chrome trace: kernels, copies and memsets each occupy the GPU.
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def recorded_steps(trace: dict) -> tuple:
    """-> (complete events, each recorded step's (start, end) on the host, in order); not a step: its annotation
    repeated on the GPU's timeline (gpu_user_annotation)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    return events, sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") != "gpu_user_annotation"
                          and str(e.get("name", "")).startswith("ProfilerStep#"))


def device_busy(trace: dict) -> dict:
    """The share of the recorded steps' wall time in which the device ran anything: the union of its activity
    intervals over the span from the first step's start on the host to the last step's end or the device's last
    activity, whichever is later (the device runs behind the host). share None when the trace has no device."""
    events, steps = recorded_steps(trace)
    device = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in DEVICE_CATEGORIES)
    if not steps or not device:
        return {"share": None, "why": "no device activity recorded" if steps else "no recorded step"}
    start, end = steps[0][0], max(steps[-1][1], device[-1][1])
    busy, reach = 0.0, start
    for a, b in device:
        a, b = max(a, reach), min(b, end)
        if b > a:
            busy, reach = busy + b - a, b
    return {"share": round(busy / (end - start), 4), "busy_us": round(busy, 1), "span_us": round(end - start, 1),
            "device_events": len(device)}


# The host's side of a step: the next batch (the DataLoader's annotation); the device, in the runtime calls that block
# until the work queued before them is done (torch reads a value or copies without non_blocking by a copy, then a
# stream synchronize; freeing device memory synchronizes too); its own work the rest (Python, launches). Every host
# thread counts: on a GPU the backward pass launches from its own.
DATA_WAIT = "enumerate(DataLoader)"
DEVICE_WAITS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaFree",
                "cudaFreeHost"}
LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch"}


def host_waits(trace: dict) -> dict:
    """Shares of the recorded steps' host wall time spent waiting for data and for the device, the mean step, and
    the kernel launches per step (a CUDA graph's replay counts as one)."""
    events, steps = recorded_steps(trace)
    if not steps:
        return {"why": "no recorded step"}
    named = [(str(e.get("name", "")).split("_v")[0], e["dur"]) for e in events  # runtime names may end in "_v<N>"
             if steps[0][0] <= e["ts"] < steps[-1][1]]
    span = sum(b - a for a, b in steps)
    data = sum(d for n, d in named if n.startswith(DATA_WAIT))
    device = sum(d for n, d in named if n in DEVICE_WAITS)
    return {"data_wait_share": round(data / span, 4), "device_wait_share": round(device / span, 4),
            "step_ms": round(span / len(steps) / 1e3, 2),
            "launches_per_step": round(sum(n in LAUNCHES for n, _ in named) / len(steps), 1)}
