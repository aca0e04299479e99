"""Reading a huge case log: the path a case's task takes (`fleetbench.measure.measure` on the saved log),
in a fresh process per log, so its peak RSS is the parse's own. Targets: a 200 MB log in < 10 s and
< 200 MB RSS (quick mode: 20 MB, same targets).

Three shapes, each of the target size, written from real logs of tests/fixtures:
- `steps`: a run that never stops printing step lines (a header, then only steps, then the result);
- `failed`: a log of errors (the real NCCL failure log repeated), so the failure evidence is searched too;
- `mixed`: real logs of every kind, concatenated.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, median

FIXTURES = ROOT / "tests" / "fixtures" / "real-logs"
TARGET_S, TARGET_RSS_MIB = 10.0, 200.0
MEASURE_SNIPPET = r"""
import json, resource, sys, time
def peak_rss_mib():  # this process's own peak (VmHWM); ru_maxrss keeps the parent's peak at the fork
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
from fleetbench.measure import measure
t = time.perf_counter()
fields, steps = measure({"command": ["x"]}, {"exit_code": 0, "log_path": sys.argv[1]})
print(json.dumps({"s": time.perf_counter() - t, "status": fields["status"], "step_count": fields["step_count"],
                  "maxrss_mib": peak_rss_mib()}))
"""


def write_log(path: Path, shape: str, size: int) -> None:
    ok = (FIXTURES / "tfcnn_resnet50_1gpu_lambda-2080ti-tf115.log").read_text()
    with path.open("w") as f:
        if shape == "steps":
            head = ok.split("Done warm up")[0] + "Done warm up\nStep\tImg/sec\ttotal_loss\n"
            step = "".join(f"{i}\timages/sec: 100.{i % 10} +/- 0.1 (jitter = 0.2)\t7.{i % 97:03d}\n"
                           for i in range(1, 1001))
            f.write(head)
            while f.tell() < size:
                f.write(step)
            f.write("-" * 40 + "\ntotal images/sec: 123.45\n" + "-" * 40 + "\n")
            return
        if shape == "failed":
            text = (FIXTURES / "tfcnn_alexnet_4gpu_lambda-3070-nccl-internalerror.log").read_text()
        else:
            text = "".join(p.read_text() for p in sorted(FIXTURES.glob("tfcnn_*.log")))
        while f.tell() < size:
            f.write(text)


def bench_logs(quick: bool) -> dict:
    size = (20 if quick else 200) * 10**6
    out = {"log_mb": size // 10**6, "target_s": TARGET_S, "target_rss_mib": TARGET_RSS_MIB}
    with tempfile.TemporaryDirectory(prefix="fleetbench-logs-") as tmp:
        for shape in ("steps", "failed", "mixed"):
            path = Path(tmp) / f"{shape}.log"
            write_log(path, shape, size)
            runs = []
            for _ in range(1 if quick else 3):
                proc = subprocess.run([sys.executable, "-c", MEASURE_SNIPPET, str(path)], capture_output=True,
                                      text=True, check=True)
                runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            s, rss = median([r["s"] for r in runs]), max(r["maxrss_mib"] for r in runs)
            out[shape] = {"s": round(s, 2), "maxrss_mib": round(rss, 1), "status": runs[0]["status"],
                          "step_count": runs[0]["step_count"], "target_met": s < TARGET_S and rss < TARGET_RSS_MIB}
            path.unlink()
    return out
