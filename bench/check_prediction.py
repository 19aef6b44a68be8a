"""The check job's prediction against the job it predicts: for each config, `run_qa.py CONFIG --check` then the
real run in the same output folder, one after the other on this machine; the predicted seconds (check.json), the
run's measured wall clock and phases (all_results.json), and their ratio. The JSON is written after every config.

    python bench/check_prediction.py                                  # configs/smoke_tiny.json, configs/smoke.json
    python bench/check_prediction.py configs/reference.json --out DIR # on a GPU node
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from run_bench import RESULTS, _device_name, _slug
from qa.io import atomic_write_json

REPO = Path(__file__).resolve().parents[1]


def run(config: str, out: Path, *flags) -> None:
    cmd = [sys.executable, str(REPO / "run_qa.py"), config, "--output_dir", str(out), *flags]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def compare(config: str, work: Path) -> dict:
    out = work / Path(config).stem
    run(config, out, "--check")
    check = json.loads((out / "check.json").read_text())
    run(config, out)
    results = json.loads((out / "all_results.json").read_text())
    predicted, measured = check["predicted"]["total_s"], results["WALL_CLOCK_SECONDS"]
    phases = {phase: {"predicted_s": seconds, "measured_s": results["wall_clock_breakdown"][phase]}
              for phase, seconds in check["predicted"]["seconds"].items()}
    return {"config": config, "predicted_s": predicted, "measured_s": measured,
            "predicted_over_measured": round(predicted / measured, 3), "time_limit": check["predicted"]["time_limit"],
            "phases": phases, "unaccounted_s": results["wall_clock_breakdown"]["unaccounted"],
            "check": {k: check["predicted"][k] for k in ("steps", "evaluations_during_training")},
            "check_measured": check["measured"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", default=["configs/smoke_tiny.json", "configs/smoke.json"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    device, _ = _device_name()
    started = datetime.now(timezone.utc)
    path = args.out / f"check-prediction-{_slug(device)}-{started:%Y%m%dT%H%M%SZ}.json"
    report = {"benchmark": "bench/check_prediction.py", "command": "python bench/check_prediction.py " + shlex.join(
        sys.argv[1:] if argv is None else argv), "device": device, "cpu_count": os.cpu_count(),
        "started": started.isoformat(timespec="seconds"), "runs": []}
    with tempfile.TemporaryDirectory(prefix="check-prediction-") as work:
        for config in args.configs:
            report["runs"].append(compare(config, Path(work)))
            atomic_write_json(path, report, indent=1)
            r = report["runs"][-1]
            print(f"{config}: predicted {r['predicted_s']:.1f} s, measured {r['measured_s']:.1f} s, "
                  f"ratio {r['predicted_over_measured']:.2f}", file=sys.stderr, flush=True)
    print(json.dumps({"json": str(path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
