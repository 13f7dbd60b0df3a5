"""torchrun process groups: NCCL on CUDA GPUs, gloo everywhere else (CPUs, and Macs: NCCL is CUDA's); a single
process needs none of it."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init(device_name: str) -> DistInfo:
    """Join the process group that torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK)."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return DistInfo()
    info = DistInfo(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ["WORLD_SIZE"]))
    use_cuda = device_name in ("auto", "cuda") and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend(use_cuda))
    return info


def backend(use_cuda: bool) -> str:
    """NCCL only for CUDA tensors; gloo for the rest (on a Mac, where `auto` may pick MPS, too)."""
    return "nccl" if use_cuda else "gloo"


def process_device(device: torch.device, info: DistInfo, flag: str = "train.device") -> torch.device:
    """This process's device: its own GPU (LOCAL_RANK) under torchrun on CUDA. Several processes on Apple's MPS
    are refused: gloo moves CPU (and CUDA) tensors only, and a Mac has one GPU."""
    if not info.enabled:
        return device
    if device.type == "cuda":
        return torch.device("cuda", info.local_rank)
    if device.type == "mps":
        raise ValueError(f"{flag} {device.type}: several processes (torchrun) cannot share Apple's MPS; "
                         f"use {flag}=cpu for a multi-process run, or one process on MPS")
    return device


def shutdown(wait_for_all: bool = True) -> None:
    """Leave the process group. After a normal finish every process waits for the others first, so none tears
    its connections down while another still uses them (rank 0 is often still saving). After an error there is
    no waiting: the other processes may never arrive."""
    if dist.is_initialized():
        if wait_for_all:
            dist.barrier()
        dist.destroy_process_group()


def mean(value: float, info: DistInfo, device: torch.device) -> float:
    """The mean of a per-process number over all processes (itself when there is one)."""
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.item() / info.world_size


def any_true(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True on every process as soon as one process says so (e.g. one of them received Ctrl-C)."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def same_on_all(obj, info: DistInfo):
    """Rank 0's value of a picklable object, on every process."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
