"""A second device on a machine that has only a CPU: the device faults a CUDA GPU would raise, raised on the CPU.

On a GPU machine the model lives on `cuda` and a tensor created without naming a device lands on the CPU; an
operation that then mixes the two fails ("Expected all tensors to be on the same device"), as does an index on the
CPU into a CUDA tensor. On a CPU-only machine both are the CPU and nothing fails. `DeviceCheck` (a TorchFunctionMode)
tells the two apart by where each tensor came from:

- *host*: made by a factory (torch.tensor, zeros, arange, from_numpy, ...) without `device=`, or by `.cpu()`;
- *device*: made with `device=`, moved by `.to(device)` / `.to(other)` / `.cuda()` (so the model's parameters and
  buffers, which `model.to(device)` moves), or computed from a device tensor;

and fails an operation that mixes a device tensor with a host tensor of one or more dimensions, or with a host index of
any size, as CUDA does (a 0-dimensional host tensor is a scalar CUDA accepts in arithmetic). Tensors it did not see made
(created before it was entered, or by autograd: gradients) are neither and never fail.

What it cannot see: a tensor created with `device="cpu"` named explicitly counts as a device tensor (on a CPU-only
machine `device` *is* "cpu"), and `.to("cpu")` as a move to the device.
"""

from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode

HOST, DEVICE = "host", "device"
_TAG = "_devicecheck"
_SITE = "_devicecheck_site"

FACTORIES = {
    torch.tensor, torch.as_tensor, torch.asarray, torch.scalar_tensor, torch.from_numpy, torch.zeros, torch.ones,
    torch.empty, torch.full, torch.arange, torch.range, torch.linspace, torch.logspace, torch.eye, torch.rand,
    torch.randn, torch.randint, torch.randperm, torch.empty_strided, torch.tril_indices, torch.triu_indices,
}
# Operations whose index argument CUDA requires on the device, whatever its size.
INDEXING = {
    torch.index_select, torch.Tensor.index_select, torch.Tensor.index_add_, torch.Tensor.index_add, torch.index_add,
    torch.Tensor.index_copy_, torch.Tensor.index_copy, torch.Tensor.index_fill_, torch.Tensor.index_fill,
    torch.gather, torch.Tensor.gather, torch.Tensor.scatter_, torch.Tensor.scatter, torch.scatter,
    torch.Tensor.scatter_add_, torch.Tensor.scatter_add, torch.take, torch.nn.functional.embedding, torch.embedding,
}
MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.type_as}
COPIES = {torch.Tensor.copy_}  # a copy between devices is allowed (it is how tensors move)


class DeviceFault(RuntimeError):
    """An operation CUDA would refuse: a host tensor (made where `site` says) meets a device tensor."""


def _tag(value):
    return getattr(value, _TAG, None) if isinstance(value, torch.Tensor) else None


def _set(value, tag: str, site: str | None = None):
    if isinstance(value, torch.Tensor):
        try:
            setattr(value, _TAG, tag)
            if site is not None:
                setattr(value, _SITE, site)
        except (AttributeError, RuntimeError):  # a tensor subclass without __dict__
            pass
    elif isinstance(value, (list, tuple)):
        for item in value:
            _set(item, tag, site)


def _tensors(value, depth: int = 0):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)) and depth < 2:
        for item in value:
            yield from _tensors(item, depth + 1)
    elif isinstance(value, dict) and depth < 2:
        for item in value.values():
            yield from _tensors(item, depth + 1)


def _site() -> str:
    """Where in peltbench (or the test) a host tensor was made: the innermost frame outside torch."""
    for frame in reversed(traceback.extract_stack(limit=12)):
        if "/torch/" not in frame.filename and "devicecheck" not in frame.filename:
            return f"{frame.filename}:{frame.lineno} ({frame.line})"
    return "unknown"


class DeviceCheck(TorchFunctionMode):
    """Inside `with DeviceCheck():`, device faults fail as on a GPU (module docstring); `faults` lists them all, also
    those some code caught."""

    def __init__(self) -> None:
        super().__init__()
        self.faults: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            out = func(*args, **kwargs)
            device = kwargs.get("device")
            if device is None:
                _set(out, HOST, _site())
            elif torch.device(device).type != "meta":  # transformers builds a model on meta, then loads its weights
                _set(out, DEVICE)
            return out
        if func in MOVES:
            return self._move(func, args, kwargs)
        inputs = [t for t in _tensors(args) if _tag(t)] + [t for t in _tensors(kwargs) if _tag(t)]
        tags = {_tag(t) for t in inputs}
        if DEVICE in tags and HOST in tags and func not in COPIES:
            self._check(func, args, inputs)
        out = func(*args, **kwargs)
        if func in COPIES or not tags:
            return out
        if DEVICE in tags:
            _set(out, DEVICE)
        else:  # computed on the host: it keeps the site of the host tensor it came from
            _set(out, HOST, next((getattr(t, _SITE) for t in inputs if hasattr(t, _SITE)), None))
        return out

    def _move(self, func, args, kwargs):
        out = func(*args, **kwargs)
        if func is torch.Tensor.cpu:
            _set(out, HOST, _site())
        elif func is torch.Tensor.cuda:
            _set(out, DEVICE)
        elif func is torch.Tensor.type_as:
            _set(out, _tag(args[1]) or _tag(args[0]))
        else:  # Tensor.to(device | other | dtype, ...): a device or another tensor names where it goes
            where = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device, torch.Tensor))),
                                              None))
            if isinstance(where, torch.Tensor):
                _set(out, _tag(where) or DEVICE)
            elif where is not None:
                _set(out, DEVICE)
            elif _tag(args[0]):
                _set(out, _tag(args[0]))
        return out

    def _check(self, func, args, inputs) -> None:
        indexing = func in INDEXING
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            # x[i]: CUDA takes host index tensors; x[i] = v: v is copied (basic i) or must be on x's device (tensors in i)
            index = [id(t) for t in _tensors(args[1])]
            advanced = func is torch.Tensor.__setitem__ and bool(index)
            inputs = [t for t in inputs if id(t) not in index and (advanced or t is args[0])]
        hosts = [t for t in inputs if _tag(t) == HOST and (t.dim() > 0 or indexing)]
        if hosts:
            name = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
            where = getattr(hosts[0], _SITE, None) or "a result computed from host tensors"
            fault = (f"{name}: a tensor on the host (shape {tuple(hosts[0].shape)}, made at {where}) meets the model's "
                     f"device: on a GPU this fails (Expected all tensors to be on the same device)")
            self.faults.append(fault)
            raise DeviceFault(fault)
