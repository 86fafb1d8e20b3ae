"""The device net itself (peltbench/devicecheck.py): every way a host tensor is born is a host tensor, and a host tensor left
in one of peltbench's own paths fails the device tests (tests/test_devices.py), as it would fail on a GPU.

What this caught on main at cadcef0 (issue 40): the net did not see tensors made by `torch.from_numpy`,
`torch.Tensor(...)`, `torch.FloatTensor(...)`, `torch.frombuffer`, `torch.from_dlpack`, another thread or a DataLoader
worker; peltbench makes every batch (data.collate_group) and every dropout-key table (methods/randomness.step_keys)
with `torch.from_numpy`, so with their `.to(device)` taken out the device tests still passed. On main at 99645ad
(issue 48): a tensor made with `device="cpu"` or moved `.to("cpu")` counted as on the device (the CPU was the model's
device's name too), so AdaLoRA's regulariser weights made on "cpu" passed every device test.
"""

from __future__ import annotations

import __future__
import copy
import inspect
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import peltbench.data
import peltbench.methods.adalora_budget
import peltbench.methods.prefix
import peltbench.methods.randomness
import peltbench.train
from conftest import save_tiny_encoder
from peltbench.devicecheck import MODEL_DEVICE, DeviceCheck, DeviceFault
from peltbench.packaged import options
from test_devices import GROUP, METHODS, gpu_path
from test_devices import test_every_method_trains_saves_and_reloads_alone_in_bf16 as device_test_alone

DEVICE = MODEL_DEVICE  # the model's device on this machine (cpu:0); "cpu" names the host
FROM_NUMPY = torch.from_numpy


def host_array() -> np.ndarray:
    return np.arange(3, dtype=np.float32)


def on_another_thread():
    made = []
    thread = threading.Thread(target=lambda: made.append(torch.ones(3)))
    thread.start()
    thread.join()
    return made[0]


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, index):
        return host_array()


def from_a_worker():
    """A DataLoader worker's batch (collated in another process, unpickled here)."""
    return next(iter(torch.utils.data.DataLoader(Rows(), batch_size=2, num_workers=1)))[0]


HOST_BORN = {
    "torch.from_numpy": lambda: torch.from_numpy(host_array()),
    "a .numpy() round trip": lambda: torch.from_numpy(torch.ones(3).numpy()),
    "torch.as_tensor(numpy)": lambda: torch.as_tensor(host_array()),
    "torch.tensor(numpy)": lambda: torch.tensor(host_array()),
    "torch.tensor(list)": lambda: torch.tensor([0.0, 1.0, 2.0]),
    "torch.asarray(list)": lambda: torch.asarray([0.0, 1.0, 2.0]),
    "torch.Tensor(list)": lambda: torch.Tensor([0.0, 1.0, 2.0]),
    "torch.FloatTensor(list)": lambda: torch.FloatTensor([0.0, 1.0, 2.0]),
    "torch.FloatTensor(size)": lambda: torch.FloatTensor(3).fill_(1.0),
    "torch.frombuffer": lambda: torch.frombuffer(bytearray(host_array().tobytes()), dtype=torch.float32),
    "torch.from_dlpack(numpy)": lambda: torch.from_dlpack(host_array()),
    "torch.arange": lambda: torch.arange(3.0),
    "torch.normal(floats)": lambda: torch.normal(0.0, 1.0, size=(3,)),
    "a collation (default_collate)": lambda: torch.utils.data.default_collate([np.float32(1), np.float32(2),
                                                                               np.float32(3)]),
    "pinned": lambda: torch.from_numpy(host_array()).pin_memory() if torch.cuda.is_available()
    else torch.from_numpy(host_array()).contiguous(),
    ".cpu() of a device tensor": lambda: torch.ones(3, device=DEVICE).cpu(),
    ".to(host.device)": lambda: torch.ones(3, device=DEVICE).to(torch.from_numpy(host_array()).device),
    "another thread": on_another_thread,
    "a DataLoader worker": from_a_worker,
    "nn.Parameter of a host tensor": lambda: torch.nn.Parameter(torch.from_numpy(host_array())),
    "computed from a host tensor": lambda: torch.from_numpy(host_array()).float() * 2,
    'device="cpu"': lambda: torch.ones(3, device="cpu"),
    'torch.tensor(list, device="cpu")': lambda: torch.tensor([0.0, 1.0, 2.0], device="cpu"),
    'device=torch.device("cpu")': lambda: torch.arange(3.0, device=torch.device("cpu")),
    'a device tensor\'s new_ones(device="cpu")': lambda: torch.ones(2, device=DEVICE).new_ones(3, device="cpu"),
    'zeros_like(a device tensor, device="cpu")': lambda: torch.zeros_like(torch.ones(3, device=DEVICE), device="cpu"),
    '.to("cpu") of a device tensor': lambda: torch.ones(3, device=DEVICE).to("cpu"),
    '.to(device="cpu") of a device tensor': lambda: torch.ones(3, device=DEVICE).to(device=torch.device("cpu")),
}


@pytest.mark.parametrize("make", list(HOST_BORN.values()), ids=list(HOST_BORN))
def test_a_host_tensor_however_born_meets_the_device_as_on_a_gpu(make):
    with DeviceCheck() as check:
        weight = torch.ones(3, device=DEVICE)
        host = make()
        with pytest.raises(DeviceFault, match="a tensor on the host"):
            weight * host
        with pytest.raises(DeviceFault):
            torch.ones(5, 3, device=DEVICE).index_select(0, host.long())  # a host index, as CUDA refuses it
    assert len(check.faults) == 2


def test_a_fault_names_where_the_host_tensor_was_made():
    with DeviceCheck():
        host = torch.from_numpy(host_array())  # here
        line = inspect.currentframe().f_lineno - 1
        with pytest.raises(DeviceFault, match=rf"made at {__file__}:{line} \(host = torch.from_numpy"):
            torch.ones(3, device=DEVICE) + host
        with pytest.raises(DeviceFault, match="born where the check could not see it .* first used at"):
            torch.ones(3, device=DEVICE) + torch.Tensor([1.0, 2.0, 3.0])


def test_numpy_of_a_device_tensor_fails_as_on_a_gpu():
    with DeviceCheck():
        with pytest.raises(DeviceFault, match=r"numpy\(\) of a tensor on the model's device"):
            torch.ones(3, device=DEVICE).numpy()
        assert torch.ones(3, device=DEVICE).cpu().numpy().tolist() == [1.0, 1.0, 1.0]


CACHE = {"before": torch.arange(3.0)}  # made before any check: a cache of the process


def test_what_a_gpu_accepts_is_no_fault():
    """Device tensors, moves (of a tensor made on "cpu" too), scalars, host indices of x[i], gradients, copies,
    Parameters, and tensors alive before the check was entered (caches: another test may have made them)."""
    with DeviceCheck() as check:
        linear = torch.nn.Linear(3, 3).to(DEVICE)
        x = torch.from_numpy(np.ones((2, 3), dtype=np.float32)).to(DEVICE, non_blocking=True)
        linear(x).sum().backward()
        gradient = linear.weight.grad
        assert (gradient * linear.weight).shape == (3, 3)
        assert torch.equal(copy.deepcopy(linear).weight, linear.weight)
        parameter = torch.nn.Parameter(torch.zeros(3, device=DEVICE))
        step = parameter * x[0] + torch.tensor(2.0) * x[torch.tensor([1])][0]  # 0-d host scalar, host index of x[i]
        assert (step + CACHE["before"] + CACHE["before"][:2].sum()).shape == (3,)
        assert (torch.ones(3, device=DEVICE) + torch.zeros(3, device=x.device)).shape == (3,)
        assert torch.from_numpy(host_array()).to(x.device).add(x[0]).shape == (3,)
        assert torch.ones(3, device="cpu").to(x.device).add(x[0]).shape == (3,)  # made on the host, then moved
        assert x.device == DEVICE and torch.zeros(3, device=x.device).add(x[0]).shape == (3,)
        assert x.to(DEVICE) is x  # a move to where it is returns it, as on a GPU (torch is given "cpu")
        host = torch.from_numpy(host_array())
        torch.ones(3, device=DEVICE).copy_(host)  # a copy between devices is how tensors move
        assert torch.as_tensor(x).add(x).shape == (2, 3)
    assert check.faults == []
    assert torch.from_numpy is FROM_NUMPY and "_make_subclass" not in vars(torch.Tensor)  # put back on exit


# ---------------------------------------------------------------- a host tensor left in peltbench's own paths


def without(monkeypatch, function, text: str, by: str = "") -> None:
    """`function` (or a class's method) with `text` taken out of its source (replaced `by`; its file's line numbers
    kept), wherever peltbench's modules hold it: the real code, less one of its moves to the device."""
    lines, first = inspect.getsourcelines(function)
    source = textwrap.dedent("".join(lines))
    assert source.count(text) == 1, f"{function.__module__}.{function.__qualname__} no longer holds {text!r} once"
    code = compile("\n" * (first - 1) + source.replace(text, by), inspect.getsourcefile(function), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    scope: dict = {}
    exec(code, vars(sys.modules[function.__module__]), scope)  # noqa: S102 - the module's own code, less `text`
    owner, _, _ = function.__qualname__.rpartition(".")
    if owner:  # a method: its class holds it
        cls = vars(sys.modules[function.__module__])[owner]
        assert vars(cls)[function.__name__] is function
        monkeypatch.setattr(cls, function.__name__, scope[function.__name__])
        return
    for name, module in list(sys.modules.items()):
        if name.startswith("peltbench") and module is not None:
            for attribute, value in list(vars(module).items()):
                if value is function:
                    monkeypatch.setattr(module, attribute, scope[function.__name__])


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    return {"bert": save_tiny_encoder("bert", tmp_path_factory.mktemp("devicecheck") / "bert")}


# (the function, the move taken out of it (or: the text, and what it reads without the move), a method whose device test
# takes that path, the file the fault names)
LEFT_ON_THE_HOST = {
    "the batch (data.collate_group)": (peltbench.data.collate_group, ("block.to(device, non_blocking=True)", "block"),
                                       "bitfit", "peltbench/data.py"),
    "the dropout keys (randomness.step_keys)": (peltbench.methods.randomness.step_keys,
                                                ".to(device, non_blocking=True)", "bitfit",
                                                "peltbench/methods/randomness.py"),
    "the gated evaluation mask (train._stack_blocks)": (peltbench.train._stack_blocks,
                                                        ("real.to(device, non_blocking=True)", "real"), "unipelt_ap",
                                                        "peltbench/train.py"),
    "P-tuning v2's position ids (prefix.shifted_positions)": (peltbench.methods.prefix.shifted_positions,
                                                              ", device=input_ids.device", "ptuning_v2",
                                                              "peltbench/methods/prefix.py"),
    # not a move taken out: the device named as "cpu" (passed the device tests before issue 48: "cpu" was the device)
    "AdaLoRA's regulariser weights made on \"cpu\" (Budget._weights)": (
        peltbench.methods.adalora_budget.Budget._weights, ("for m in range(self.count)], device)",
                                                           'for m in range(self.count)], "cpu")'),
        "adalora", "peltbench/methods/adalora_budget.py"),
}


@pytest.mark.parametrize("function,text,method,site", list(LEFT_ON_THE_HOST.values()), ids=list(LEFT_ON_THE_HOST))
def test_a_host_tensor_left_in_peltbench_fails_the_device_test(function, text, method, site, checkpoints, glue_dir,
                                                               tmp_path, monkeypatch):
    """peltbench's code with one move to the device taken out: that method's row of tests/test_devices.py fails, and
    the fault names the line that made the host tensor."""
    without(monkeypatch, function, *([text] if isinstance(text, str) else text))
    gpu_path(monkeypatch)
    with DeviceCheck() as check:
        with pytest.raises((AssertionError, DeviceFault), match="DeviceFault|a tensor on the host"):
            device_test_alone(method, checkpoints, glue_dir, tmp_path, check)
    assert check.faults, "the run failed, but not by the net"
    assert f"{site}:" in check.faults[0], check.faults[0]


def test_every_method_keeps_its_row_in_the_device_tests():
    """A fault on one method's own path (the two above: gated methods, P-tuning v2) is caught by that row alone."""
    assert METHODS == sorted(options("method"))
    assert GROUP == [method for method in METHODS if method not in ("ft", "prompt")]
