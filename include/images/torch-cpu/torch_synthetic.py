#!/usr/bin/env python3
"""fleetbench's torch_synthetic harness: training throughput of a torchvision model on synthetic data.

A plain training loop (forward, loss, backward, SGD step) on one random batch kept on the device, so the
number measures the model, the framework and the hardware, not a data pipeline. Warm-up steps (and
torch.compile's compilation) are not timed; each timed step ends with the loss read back, which waits
for the device. Prints one line per timed step and JSON metric lines at the end:

    step 3: 412.50 images/sec loss 6.9312
    {"metric": "images_per_sec", "value": 405.1, "unit": "images/s", "better": "higher"}

Under torchrun (RANK and WORLD_SIZE in the environment) each process is one rank of a process group
(`--dist_backend`: gloo on CPU, nccl on CUDA by default) training a DistributedDataParallel copy of the
model on its own batch of `--batch_size` (one GPU each: LOCAL_RANK); rank 0 alone prints, once every rank
has joined (`joined process group: rank 0 of N`), and its figures are the whole group's: per-rank batch x
world size / rank 0's step time (each step ends with the gradients' all-reduce, so no rank is ahead).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def emit(metric: str, value: float, unit: str, better: str) -> None:
    print(json.dumps({"metric": metric, "value": value, "unit": unit, "better": better}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a torchvision classification model, e.g. resnet50")
    parser.add_argument("--batch_size", type=int, required=True, help="per device")
    parser.add_argument("--num_batches", type=int, default=20)
    parser.add_argument("--num_warmup_batches", type=int, default=2)
    parser.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    parser.add_argument("--channels_last", type=int, choices=[0, 1], default=0)
    parser.add_argument("--compile", type=int, choices=[0, 1], default=0)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--num_gpus", type=int, default=1)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--num_classes", type=int, default=1000)
    parser.add_argument("--dist_backend", choices=["auto", "gloo", "nccl"], default="auto",
                        help="under torchrun: the process group's backend (auto: nccl on cuda, gloo on cpu)")
    args = parser.parse_args()

    import torch
    import torchvision

    torch.manual_seed(0)
    device = torch.device(args.device)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return distributed(args, torch, torchvision, device)
    devices = max(args.num_gpus, 1) if device.type == "cuda" else 1
    print(f"torch {torch.__version__} torchvision {torchvision.__version__} device {device} x{devices} "
          f"model {args.model} batch {args.batch_size} precision {args.precision} "
          f"channels_last {args.channels_last} compile {args.compile}", flush=True)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = torchvision.models.get_model(args.model, weights=None, num_classes=args.num_classes)
    model = model.to(device=device, memory_format=memory_format).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    network = torch.nn.DataParallel(model, device_ids=list(range(devices))) if devices > 1 else model
    if args.compile:
        network = torch.compile(network)
    batch = args.batch_size * devices
    step = training_step(args, torch, network, optimizer, batch, device, memory_format)
    for _ in range(args.num_warmup_batches):
        step()
    emit_results(*timed_steps(step, args.num_batches, batch, show=True), batch)
    return 0


def distributed(args, torch, torchvision, device) -> int:
    """One rank of a torchrun job: DDP over the process group; rank 0 prints the group's throughput."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    backend = args.dist_backend if args.dist_backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend=backend)
    try:
        lead = rank == 0
        if lead:
            print(f"joined process group: rank 0 of {world} backend {backend}", flush=True)
            print(f"torch {torch.__version__} torchvision {torchvision.__version__} device {device.type} "
                  f"x{world} ranks model {args.model} batch {args.batch_size} per rank precision {args.precision} "
                  f"channels_last {args.channels_last} compile {args.compile}", flush=True)
        memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
        model = torchvision.models.get_model(args.model, weights=None, num_classes=args.num_classes)
        model = model.to(device=device, memory_format=memory_format).train()
        network = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer = torch.optim.SGD(network.parameters(), lr=0.01, momentum=0.9)
        if args.compile:
            network = torch.compile(network)
        batch = args.batch_size
        step = training_step(args, torch, network, optimizer, batch, device, memory_format)
        for _ in range(args.num_warmup_batches):
            step()
        dist.barrier()
        total = batch * world  # DDP all-reduces the gradients in each step's backward
        times, loss = timed_steps(step, args.num_batches, total, show=lead)
        dist.barrier()
        if lead:
            emit_results(times, loss, total)
    finally:
        dist.destroy_process_group()
    return 0


def training_step(args, torch, network, optimizer, batch: int, device, memory_format):
    """One SGD step of `network` on a synthetic batch made once (the input pipeline is not what is measured),
    in the case's precision; the step returns the loss, which waits for the device."""
    images = torch.randn(batch, 3, args.image_size, args.image_size, device=device).to(memory_format=memory_format)
    labels = torch.randint(0, args.num_classes, (batch,), device=device)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.precision)
    scaler = torch.amp.GradScaler(device.type) if args.precision == "fp16" else None
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(network(images), labels)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        return loss.item()

    return step


def timed_steps(step, num_batches: int, images_per_step: int, show: bool) -> tuple[list[float], float]:
    """Time `num_batches` steps; `show`: print each step's images/sec (the harness's step lines)."""
    times, loss = [], float("nan")
    for i in range(1, num_batches + 1):
        start = time.perf_counter()
        loss = step()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        if show:
            print(f"step {i}: {images_per_step / elapsed:.2f} images/sec loss {loss:.4f}", flush=True)
    return times, loss


def emit_results(times: list[float], loss: float, images_per_step: int) -> None:
    """The case's metric lines: throughput (the primary metric), median step time, final loss."""
    emit("images_per_sec", images_per_step * len(times) / sum(times), "images/s", "higher")
    emit("step_time_median", statistics.median(times) * 1000, "ms", "lower")
    emit("final_loss", loss, "1", "lower")


if __name__ == "__main__":
    raise SystemExit(main())
