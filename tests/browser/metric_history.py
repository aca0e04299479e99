"""A warehouse history of three harnesses' primary metrics (the report's per-metric trend charts): tf_cnn_benchmarks
rows as stored before rows named a metric (images/sec, 1 and 2 GPUs), nccl_tests' avg_busbw in GB/s on 8 GPUs and a
command benchmark's p99 latency (ms, lower is better) and token rate, on two hosts over five nights."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from warehouse_rows import result_row, run_row

NIGHT0 = datetime(2026, 11, 1, 2, 0, tzinfo=timezone.utc)
NIGHTS = 5
IMAGES_G1 = "throughput-resnet50_g1"
IMAGES_G2 = "throughput-resnet50_g2"
BUSBW = "throughput-all_reduce_g8-avg_busbw-GB_s"
LATENCY = "throughput-svc-p99_latency-ms"
TOKENS = "throughput-svc-tokens_per_sec-tok_s"


def busbw(host: str, night: int) -> float:
    return 180.0 + night + (5.0 if host == "h2" else 0.0)


def latency(night: int) -> float:
    return 10.0 + night * 0.25


def rows_of(night: int, run_id: str, when: str) -> list[dict]:
    common = {"run_id": run_id, "logical_date": when, "started_at": when, "finished_at": when}
    rows = []
    for host in ("h1", "h2"):
        for gpus, ips in ((1, 400.0), (2, 760.0)):  # no metric column: stored the way rows were before harnesses
            eff = (ips + night) / (gpus * (400.0 + night)) if gpus > 1 else None  # what `derive` puts there
            rows.append(result_row(f"tf.resnet50.bs64.g{gpus}.replicated", host=host, ips=ips + night, num_gpus=gpus,
                                   batch_size_global=64 * gpus, speedup_efficiency=eff, **common))
        rows.append(result_row("nccl.all_reduce.g8", host=host, ips=None, harness="nccl_tests", benchmark="nccl",
                               model="all_reduce", num_gpus=8, metric="avg_busbw", value=busbw(host, night),
                               unit="GB/s", better="higher", **common))
    rows.append(result_row("svc.latency", host="h1", ips=None, harness="command", benchmark="svc", model=None,
                           num_gpus=0, device="cpu", metric="p99_latency", value=latency(night), unit="ms",
                           better="lower", **common))
    rows.append(result_row("svc.tokens", host="h1", ips=None, harness="command", benchmark="svc", model=None,
                           num_gpus=0, device="cpu", metric="tokens_per_sec", value=1200.0 + night, unit="tok/s",
                           better="higher", **common))
    return rows


def store_metric_history(engine) -> None:
    from fleetbench.warehouse import store_run

    for night in range(NIGHTS):
        when = (NIGHT0 + timedelta(days=night)).isoformat()
        run_id = f"scheduled__{when}"
        store_run(engine, {**run_row(run_id), "logical_date": when}, [], rows_of(night, run_id, when))
