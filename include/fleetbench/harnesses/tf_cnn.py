"""tf_cnn_benchmarks: total images/sec (primary), top-1/top-5 accuracy and the per-step images/sec."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from fleetbench.failures import FAILING_LOG_CLASSES, row_class
from fleetbench.harnesses.base import HIGHER, CasePoint, Harness, Measured, SampleSink

if TYPE_CHECKING:
    from fleetbench.config import BenchmarkSpec
    from fleetbench.parsing import ParsedLog



def case_key(bench: str, model: str, batch_size: int, num_gpus: int, variable_update: str) -> str:
    """`<benchmark>.<model>.bs<batch per device>.g<gpus>.<variable_update>`: readable and valid in container names."""
    return f"{bench}.{model}.bs{batch_size}.g{num_gpus}.{variable_update}"


def from_parsed(parsed: "ParsedLog") -> Measured:
    """A tf_cnn_benchmarks (or Horovod synthetic) ParsedLog as metric samples."""
    failing = parsed.failure_class in FAILING_LOG_CLASSES
    measured = Measured(primary="images_per_sec",
                        failure_class=row_class(parsed.failure_class) if failing else None,
                        failure_detail=parsed.failure_detail,
                        step_count=parsed.step_count, images_per_sec=parsed.total_images_per_sec,
                        accuracy_top1=parsed.accuracy_top1)
    measured.steps = [{"step": s.step, "images_per_sec": s.images_per_sec, "plusminus": s.plusminus,
                       "jitter": s.jitter, "loss": s.loss} for s in parsed.steps]
    sink = SampleSink(measured)
    if parsed.total_images_per_sec is not None:
        sink.add("images_per_sec", parsed.total_images_per_sec, "images/s", HIGHER)
    if parsed.accuracy_top1 is not None:
        sink.add("accuracy_top1", parsed.accuracy_top1, "1", HIGHER)
    if parsed.accuracy_top5 is not None:
        sink.add("accuracy_top5", parsed.accuracy_top5, "1", HIGHER)
    return sink.done()


class TfCnnBenchmarks(Harness):
    name = "tf_cnn_benchmarks"
    axes = ("models", "batch_sizes", "num_gpus", "variable_update")
    required = ("models", "batch_sizes")
    primary = ("images_per_sec", "images/s", HIGHER)
    description = "TensorFlow tf_cnn_benchmarks: total images/sec, accuracy, step throughput"
    passes_num_batches = True

    def points(self, bench: "BenchmarkSpec") -> list[CasePoint]:
        return [CasePoint(case_key(bench.name, model, bs, gpus, vu), model, bs, gpus, vu,
                          {"model": model, "batch_size": bs, "num_gpus": gpus, "variable_update": vu})
                for model in bench.models for gpus in bench.num_gpus for bs in bench.batch_sizes
                for vu in bench.variable_update]

    def command(self, prefix: Iterable[str], bench: "BenchmarkSpec", point: CasePoint) -> list[str]:
        """tf_cnn_benchmarks flags for one case. CPU cases run one device (`--num_gpus=1 --device=cpu`), as
        tf_cnn_benchmarks expects."""
        args = [
            *prefix,
            f"--model={point.model}",
            f"--batch_size={point.batch_size}",
            f"--num_batches={bench.num_batches}",
            f"--num_warmup_batches={bench.num_warmup_batches}",
            f"--variable_update={point.variable_update}",
        ]
        if bench.device == "cpu":
            args += ["--device=cpu", "--num_gpus=1", "--data_format=NHWC"]
        else:
            args += ["--device=gpu", f"--num_gpus={point.num_gpus}"]
        return args + list(bench.extra_args)

    def check(self, bench: dict, path: str) -> list[str]:
        """Matrix points tf_cnn_benchmarks refuses when a case is one process (benchmark_cnn.py at the upstream
        commit README cites): distributed_replicated outside a cluster of hosts, and horovod with more than one GPU
        (upstream runs horovod as one process per GPU under mpirun; a case here is one process). Multi-node
        benchmarks have their own checks (`config._multinode_errors`)."""
        updates, nodes, gpus = (bench.get(k, d) for k, d in (("variable_update", ["parameter_server"]),
                                                             ("nodes", [1]), ("num_gpus", [1])))
        if not all(isinstance(v, list) for v in (updates, nodes, gpus)):
            return []  # the field checks report the shape
        errors = []
        if "distributed_replicated" in updates and not any(isinstance(n, int) and n > 1 for n in nodes):
            errors.append(f"{path}.variable_update[{updates.index('distributed_replicated')}]: distributed_replicated "
                          "runs across hosts (nodes > 1); tf_cnn_benchmarks refuses it in one process (\"Invalid "
                          "variable_update in local mode\"): use replicated on one host")
        if "horovod" in updates and bench.get("device", "gpu") == "gpu":
            errors += [f"{path}.num_gpus[{k}]: {n} with variable_update horovod: tf_cnn_benchmarks runs horovod with "
                       "one GPU per process (\"Horovod benchmarks require num_gpus=1 on each worker\"), and a case is "
                       "one process: give horovod its own benchmark with num_gpus [1]"
                       for k, n in enumerate(gpus) if isinstance(n, int) and n > 1]
        return errors

    def own_flags(self, bench: dict) -> dict[str, str]:
        flags = {"model": "from models", "batch_size": "from batch_sizes", "num_batches": "from num_batches",
                 "num_warmup_batches": "from num_warmup_batches", "variable_update": "from variable_update",
                 "device": "from device", "num_gpus": "from num_gpus"}
        if bench.get("device") == "cpu":
            flags["data_format"] = "NHWC with device cpu"
        cluster = "a cluster flag of nodes > 1"
        return {**flags, **dict.fromkeys(("job_name", "ps_hosts", "worker_hosts", "task_index"), cluster)}

    def measure(self, path: str, settings: dict) -> Measured:
        from fleetbench.parsing import parse_log_file

        try:
            parsed = parse_log_file(path, "tf_cnn_benchmarks")
        except ValueError:
            return Measured(primary="images_per_sec")
        return from_parsed(parsed)


HARNESS = TfCnnBenchmarks()
