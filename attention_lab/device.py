"""Device and precision choices shared by train.py and sample.py, with fallbacks to the CPU."""

from __future__ import annotations

import contextlib

import torch


def pick_device(name: str, flag: str = "device") -> torch.device:
    """auto (cuda if available, else cpu), cpu, cuda, cuda:N or mps; ValueError naming `flag` otherwise."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ValueError(f"{flag} {name!r} is not a device: use auto, cpu, cuda, cuda:N or mps ({e})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{flag} {name} asks for a GPU, but CUDA is not available here; use cpu (or auto)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{flag} {name} asks for Apple's MPS, which is not available here; use cpu (or auto)")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{flag} {name}: only cpu, cuda and mps are supported")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype. auto: bf16 on GPUs that support it, float32 (no autocast) elsewhere.

    On CPUs with native bf16 (AVX512-BF16, AMX) `bfloat16` trains about 2.7x faster (bench/), but emulated bf16
    is slower than float32 on most laptops, so auto keeps float32 on the CPU.
    """
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision for the forward pass; float32 runs without autocast."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
