"""nccl_tests: NCCL collective bandwidth (nccl-tests' *_perf binaries), the interconnect's health.

Primary metric: the average bus bandwidth (GB/s) the test prints; also busbw and algbw at the largest
size, out-of-place and in-place. Wrong results, CUDA errors and NCCL errors fail the case
(fleetbench.parsing.nccl). The binaries are not in NGC images: bake them (README, fleet.gpu-example.yaml).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from fleetbench.files import open_regular
from fleetbench.harnesses.base import HIGHER, LOWER, CasePoint, Harness, Measured, SampleSink

if TYPE_CHECKING:
    from fleetbench.config import BenchmarkSpec

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv",
               "scatter", "gather", "hypercube")


class NcclTests(Harness):
    name = "nccl_tests"
    axes = ("collectives", "num_gpus", "size_ranges")
    required = ("collectives",)
    fields = ("nccl_tests_dir", "command")
    needs_argv = False
    gpu_only = True
    primary = ("avg_busbw", "GB/s", HIGHER)
    description = "nccl-tests: average bus bandwidth, busbw/algbw at the largest size"
    abbreviated_flags = True  # getopt_long takes --min for --minbytes

    def points(self, bench: "BenchmarkSpec") -> list[CasePoint]:
        return [CasePoint(f"{bench.name}.{coll}.g{gpus}.{rng.replace(':', '-')}", coll, None, gpus, None,
                          {"collective": coll, "num_gpus": gpus, "size_range": rng})
                for coll in bench.collectives for gpus in bench.num_gpus for rng in bench.size_ranges]

    def command(self, prefix: Iterable[str], bench: "BenchmarkSpec", point: CasePoint) -> list[str]:
        """`[launcher...] <dir>/<collective>_perf -b MIN -e MAX -f 2 -g GPUS -c 1`: the benchmark's `command`,
        if any, is a launcher in front (e.g. mpirun ...); the image's command is for other harnesses."""
        low, high = point.axes["size_range"].split(":")
        binary = f"{bench.nccl_tests_dir.rstrip('/')}/{point.model}_perf"
        return [*(bench.command or []), binary, "-b", low, "-e", high, "-f", "2", "-g", str(point.num_gpus),
                "-c", "1", *bench.extra_args]

    def own_flags(self, bench: dict) -> dict[str, str]:
        """The long forms of -b, -e, -f, -g and -c."""
        return {"minbytes": "-b, from size_ranges", "maxbytes": "-e, from size_ranges", "stepfactor": "-f 2",
                "ngpus": "-g, from num_gpus", "check": "-c 1"}

    def measure(self, path: str, settings: dict) -> Measured:
        from fleetbench.parsing.source import file_lines

        with open_regular(path) as handle:
            return measure_lines(file_lines(handle))


def measure_lines(lines: Iterable[tuple[str, bool]]) -> Measured:
    from fleetbench.parsing.nccl import parse_nccl

    log = parse_nccl(lines)
    failure_class, detail = log.failure()
    measured = Measured(primary="avg_busbw", failure_class=failure_class, failure_detail=detail,
                        step_count=log.row_count)
    sink = SampleSink(measured)
    if log.avg_busbw is not None:
        sink.add("avg_busbw", log.avg_busbw, "GB/s", HIGHER)
    largest = log.largest
    if largest is not None:
        for placement, half in (("out_of_place", largest.oop), ("in_place", largest.ip)):
            labels = {"placement": placement, "size_bytes": largest.size}
            for metric in ("busbw", "algbw"):
                if half.get(metric) is not None:
                    sink.add(metric, half[metric], "GB/s", HIGHER, labels)
            if half.get("time") is not None:
                sink.add("time", half["time"], "us", LOWER, labels)
    if log.out_of_bounds is not None:
        sink.add("out_of_bounds_values", log.out_of_bounds, "count", LOWER)
    sink.add("nccl_warnings", log.warnings, "count", LOWER)
    return sink.done()


HARNESS = NcclTests()
