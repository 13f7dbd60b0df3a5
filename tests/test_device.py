"""Device and dtype choice: CPU fallbacks and clear errors for devices that are not there."""

from __future__ import annotations

import contextlib

import pytest
import torch

from attention_lab.device import autocast, pick_device, pick_dtype


def test_auto_picks_cuda_only_when_there_is_one():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto").type == expected


@pytest.mark.parametrize("name, match", [("quantum", "not a device"), ("tpu", "not a device|only cpu")])
def test_unknown_devices_are_named_in_the_error(name, match):
    with pytest.raises(ValueError, match=match):
        pick_device(name, "train.device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_a_missing_gpu_says_to_use_the_cpu():
    with pytest.raises(ValueError, match=r"train.device cuda asks for a GPU.*use cpu"):
        pick_device("cuda", "train.device")


@pytest.mark.parametrize("caps, expected", [
    ({"amx_bf16": True, "avx512_bf16": True}, torch.bfloat16),
    ({"amx_bf16": False, "avx512_bf16": True}, torch.bfloat16),
    ({"amx_bf16": False, "avx512_bf16": False, "avx2": True}, torch.float32),
    ({}, torch.float32),
])
def test_auto_dtype_on_the_cpu_is_bf16_only_with_native_bf16(monkeypatch, caps, expected):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    assert pick_dtype("auto", torch.device("cpu")) == expected


def test_auto_dtype_follows_this_cpus_capabilities_and_float32_autocast_is_a_no_op():
    cpu = torch.device("cpu")
    caps = torch.cpu.get_capabilities()
    native = bool(caps.get("amx_bf16") or caps.get("avx512_bf16"))
    assert pick_dtype("auto", cpu) == (torch.bfloat16 if native else torch.float32), caps
    assert isinstance(autocast(cpu, torch.float32), contextlib.nullcontext)
    assert pick_dtype("bfloat16", cpu) == torch.bfloat16
    with autocast(cpu, torch.bfloat16):
        y = torch.ones(2, 2) @ torch.ones(2, 2)
    assert y.dtype == torch.bfloat16, "bf16 autocast on the CPU must run matmuls in bf16"
