"""Device and precision: which device and dtype a run uses, autocast, eval mode, GPU synchronisation, threads.

Shared by train.py, sample.py, the library and bench/ (one set of helpers, no copies)."""

from __future__ import annotations

import contextlib
import platform

import torch


def pick_device(name: str, flag: str = "device") -> torch.device:
    """auto (CUDA if available, else Apple's MPS if available, else the CPU), cpu, cuda, cuda:N or mps;
    ValueError naming `flag` otherwise. Nothing here has run on a Mac: the MPS branch is tested with the backend
    mocked (tests/test_device.py)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
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


def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bf16 matmuls in hardware (AMX-BF16 or AVX512-BF16), as torch reports it."""
    try:
        caps = torch.cpu.get_capabilities()
    except (AttributeError, RuntimeError):  # torch < 2.5 has no capability probe: assume not
        return False
    return bool(caps.get("amx_bf16") or caps.get("avx512_bf16"))


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype. auto: bf16 where the hardware has it (a GPU that supports it, a CPU with AMX-BF16 or
    AVX512-BF16), float32 (no autocast) elsewhere, Apple's MPS included.

    Emulated bf16 on a CPU without those units is slower than float32, so auto never picks it there; a bf16
    matmul on AMX is 4-8x a float32 one. The loss is always computed in float32 (model/gpt.py).

    MPS: auto is float32. bf16 autocast needs macOS 14 or newer and M1/M2 GPUs have no bf16 units (emulated,
    as on a CPU without them); float16 needs a GradScaler and was never measured here (no Mac). Either can be
    asked for by name; bfloat16 on an older macOS is refused here, in words, instead of deep inside torch.
    """
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        if device.type == "cpu" and cpu_has_native_bf16():
            return torch.bfloat16
        return torch.float32
    if name == "bfloat16" and device.type == "mps" and not torch.backends.mps.is_macos_or_newer(14, 0):
        raise ValueError("dtype bfloat16 on Apple's MPS needs macOS 14 or newer; use float32 (auto) or float16")
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision for the forward pass; float32 runs without autocast."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@contextlib.contextmanager
def decoding_threads(device: torch.device, threads: int | None):
    """torch's CPU threads set to `threads` inside, and restored afterwards (an error too); None, or a device
    other than the CPU, leaves them alone. Batch-1 decoding with the KV cache is a few small matrix-vector
    products a token, where a second thread may only add a wait (bench/threads.py on a 2-core AMD EPYC, the
    default model, 500 tokens, against OMP_WAIT_POLICY=PASSIVE: one thread 1.20x idle and 1.01x beside a busy
    process, two threads with libgomp's default spin 1.15x idle but 0.37x contended), or halve a step the CPU's
    memory bandwidth bounds: sampling measures one thread against all (runtime/decoding.decoding_thread_count)."""
    if device.type != "cpu" or threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work (CUDA or MPS), so a timer stopped afterwards measures it; a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """The model in eval mode (no dropout) inside the block, its own mode restored after, even on an error."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), for the machine line of every table and report."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
