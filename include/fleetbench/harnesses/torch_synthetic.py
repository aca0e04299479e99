"""torch_synthetic: PyTorch training throughput of a torchvision model on synthetic data.

The training loop is the project's own (include/images/torch-cpu/torch_synthetic.py, in the CPU image and
for baking into GPU images): it prints a line per timed step and JSON metric lines (images_per_sec, the
primary; step_time_median; final_loss), read as the command harness reads them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable

from fleetbench.files import open_regular
from fleetbench.harnesses.base import HIGHER, CasePoint, Harness, Measured

if TYPE_CHECKING:
    from fleetbench.config import BenchmarkSpec

_STEP = re.compile(r"^step (\d{1,9}): ([0-9]{1,12}(?:\.[0-9]{1,9})?) images/sec loss ([-+0-9.eEnaif]{1,30})$")
MAX_STEPS = 100_000


def case_key(bench: str, model: str, batch_size: int, num_gpus: int, precision: str, channels_last: bool,
             compiled: bool) -> str:
    """`<benchmark>.<model>.bs<batch>.g<gpus>.<precision>.<nchw|nhwc>.<eager|compiled>`."""
    return (f"{bench}.{model}.bs{batch_size}.g{num_gpus}.{precision}.{'nhwc' if channels_last else 'nchw'}."
            f"{'compiled' if compiled else 'eager'}")


class TorchSynthetic(Harness):
    name = "torch_synthetic"
    axes = ("models", "batch_sizes", "num_gpus", "precisions", "channels_last", "compile")
    required = ("models", "batch_sizes")
    primary = ("images_per_sec", "images/s", HIGHER)
    description = "PyTorch synthetic-data training: images/sec of torchvision models"
    abbreviated_flags = True  # torch_synthetic.py's argparse takes --batch for --batch_size
    passes_num_batches = True
    # channels_last and torch.compile change the activations' memory a lot: an eager OOM says nothing of the
    # compiled case at that batch (include/images/torch-cpu/torch_synthetic.py: both default to 0).
    memory_flags = (("channels_last", "0"), ("compile", "0"))

    def memory_variant(self, command: Any) -> str:
        """`memory_flags`, and on CUDA with more than one GPU in one process (`DataParallel`: the whole input batch,
        `--batch_size` x GPUs, is made on GPU 0, which then holds the gathered outputs too) `data_parallel=N`:
        GPU 0's peak memory at a batch per device grows with N, so a 4-GPU case's readings are not a 1-GPU
        profile's points, nor its OOMs a bound for 1 GPU. A launcher (torchrun) case's ranks hold one GPU each."""
        from fleetbench.metrics import command_argv

        variant = super().memory_variant(command)
        argv = [str(a) for a in command_argv(command) or []]
        flags = {}
        for arg in argv:
            name, eq, value = arg.partition("=")
            if eq and name in ("--device", "--num_gpus"):
                flags[name] = value
        if flags.get("--device") == "cpu" or any(a.rsplit("/", 1)[-1] == "torchrun" for a in argv):
            return variant
        gpus = flags.get("--num_gpus", "1")
        return f"{variant},data_parallel={gpus}" if gpus.isdigit() and int(gpus) > 1 else variant

    def points(self, bench: "BenchmarkSpec") -> list[CasePoint]:
        return [CasePoint(case_key(bench.name, model, bs, gpus, prec, cl, comp), model, bs, gpus, None,
                          {"model": model, "batch_size": bs, "num_gpus": gpus, "precision": prec,
                           "channels_last": cl, "compile": comp})
                for model in bench.models for gpus in bench.num_gpus for bs in bench.batch_sizes
                for prec in bench.precisions for cl in bench.channels_last for comp in bench.compile]

    def command(self, prefix: Iterable[str], bench: "BenchmarkSpec", point: CasePoint) -> list[str]:
        axes = point.axes
        return [*prefix, f"--model={point.model}", f"--batch_size={point.batch_size}",
                f"--num_batches={bench.num_batches}", f"--num_warmup_batches={bench.num_warmup_batches}",
                f"--precision={axes['precision']}", f"--channels_last={int(axes['channels_last'])}",
                f"--compile={int(axes['compile'])}",
                *(["--device=cpu", "--num_gpus=1"] if bench.device == "cpu" else
                  ["--device=cuda", f"--num_gpus={point.num_gpus}"]),
                *bench.extra_args]

    def check(self, bench: dict, path: str) -> list[str]:
        compiles = bench.get("compile")
        warmup = bench.get("num_warmup_batches", 5)
        compiled = compiles is True or (isinstance(compiles, list) and any(c is True for c in compiles))
        if compiled and warmup == 0 and not isinstance(warmup, bool):
            return [f"{path}.num_warmup_batches: 0 with compile true would time torch.compile's compilation in the "
                    "first steps (seconds to minutes); give 1 or more, got 0"]
        return []

    def own_flags(self, bench: dict) -> dict[str, str]:
        return {"model": "from models", "batch_size": "from batch_sizes", "num_batches": "from num_batches",
                "num_warmup_batches": "from num_warmup_batches", "precision": "from precisions",
                "channels_last": "from channels_last", "compile": "from compile", "device": "from device",
                "num_gpus": "from num_gpus", "dist_backend": "from backend, with nodes > 1"}

    def measure(self, path: str, settings: dict) -> Measured:
        from fleetbench.parsing.source import file_lines

        with open_regular(path) as handle:
            return measure_lines(file_lines(handle))


def measure_lines(lines: Iterable[tuple[str, bool]]) -> Measured:
    from fleetbench.failures import FAILING_LOG_CLASSES, row_class
    from fleetbench.harnesses.command import measure_lines as metric_lines
    from fleetbench.parsing.detect import failure_scanner
    from fleetbench.parsing.model import to_float

    steps: list[dict] = []
    count = 0
    evidence = failure_scanner()  # a CUDA OOM, NCCL or import error names the failure (as for tf_cnn_benchmarks)

    def tap(source):  # the step lines and failure evidence, on the way to the metric-line reader
        nonlocal count
        for index, (line, complete) in enumerate(source):
            evidence.feed(index, line.strip())
            found = _STEP.match(line.strip()) if complete and line.startswith("step ") else None
            if found:
                count += 1
                if len(steps) < MAX_STEPS:
                    try:  # a diverged run's `nan`/`inf` loss is None, as tf_cnn_benchmarks' (parsing.model.to_float)
                        loss = to_float(found.group(3))
                    except ValueError:
                        loss = None
                    steps.append({"step": int(found.group(1)), "images_per_sec": float(found.group(2)),
                                  "plusminus": None, "jitter": None, "loss": loss})
            yield line, complete

    measured = metric_lines(tap(lines), {"json_lines": True, "primary": "images_per_sec", "patterns": []})
    measured.steps, measured.step_count = steps, count
    log_class, detail = evidence.verdict()
    if log_class in FAILING_LOG_CLASSES:
        measured.failure_class, measured.failure_detail = row_class(log_class), detail
    sample = measured.primary_sample()
    measured.images_per_sec = sample.value if sample else None
    return measured


HARNESS = TorchSynthetic()
