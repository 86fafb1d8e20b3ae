"""A second device on a machine that has only a CPU: the device faults a CUDA GPU would raise, raised on the CPU.

On a GPU machine the model lives on `cuda` and a tensor created without naming a device lands on the CPU; an
operation that then mixes the two fails ("Expected all tensors to be on the same device"), as do an index on the CPU
into a CUDA tensor and `.numpy()` of a CUDA tensor. On a CPU-only machine both are the CPU and nothing fails.
`DeviceCheck` (a TorchFunctionMode) tells the two apart by where each tensor came from:

- *device*: made with `device=` naming the model's device, moved there by `.to(device)` / `.to(other)` / `.cuda()`
  (so the model's parameters and buffers, which `model.to(device)` moves), computed from a device tensor (its `.grad`
  too), or a Parameter of one;
- *host*: any other tensor made while the check is entered, however it is born. Named where it is born: a factory
  (torch.tensor, as_tensor, zeros, arange, ...) without `device=` or with `device="cpu"` (or `torch.device("cpu")`),
  `torch.from_numpy` (a `.numpy()` round trip too), `torch.frombuffer`, `torch.from_dlpack` of a host array, a
  DataLoader worker's batch unpickled here, `.cpu()`, `.to("cpu")`, `.to(x.device)` of a host `x`, or a result
  computed from host tensors only (`pin_memory()`, a collation's `torch.stack`, ...). A tensor born where no
  TorchFunctionMode sees it (`torch.Tensor(...)`, `torch.FloatTensor(...)` and the other legacy constructors, another
  thread, a C extension) carries no tag: a host tensor too, named where it is first used;
- *before*: alive when the check was entered (caches, a test's models), or computed from such tensors only: neither,
  never a fault (a tag an earlier check left on a cached tensor is not this check's).

It fails an operation that mixes a device tensor with a host tensor of one or more dimensions, or with a host index of
any size, as CUDA does (a 0-dimensional host tensor is a scalar CUDA accepts in arithmetic), and `.numpy()` of a
device tensor. A tensor really on a GPU or on `meta` is never a host tensor (under PELTBENCH_TEST_DEVICE=cuda the check
runs beside CUDA, which fails what mixes devices itself).

On a CPU-only machine the model's device and the host are one device with two names: the model's device is
MODEL_DEVICE, `cpu:0` (tests/test_devices.py's runs resolve their device to it), the host is the CPU named without an
index (`"cpu"`, `torch.device("cpu")`), as a GPU machine names its host. A device tensor's `x.device` answers
MODEL_DEVICE, so a tensor made or moved with `device=x.device` lands on the model's device, as on a GPU; a tensor made
with `device="cpu"` is a host tensor until it is moved (VeRA's and FourierFT's draws on the CPU, copied into their
buffers: a copy between devices is allowed).

What it cannot see: tensors alive before it was entered (tests build what they check inside it); a custom autograd
Function's backward (no TorchFunctionMode runs there).
"""

from __future__ import annotations

import functools
import gc
import linecache
import sys

import torch
import torch.multiprocessing.reductions
import torch.utils.dlpack
from torch.overrides import TorchFunctionMode

HOST, DEVICE, BEFORE = "host", "device", "before"
MODEL_DEVICE = torch.device("cpu", 0)  # the model's device on a CPU-only machine ("cpu", without an index, is the host)
CPU = torch.device("cpu")
_TAG = "_devicecheck"  # (generation, tag, site): what the outermost check entered `generation`-th saw of a tensor
UNSEEN = ("a tensor born where the check could not see it (torch.Tensor(...), torch.FloatTensor(...) or another legacy "
          "constructor, another thread, a C extension), first used at {}")

# Factories: on the host unless `device=` names one, whatever tensors they are given (a size, a fill value).
FACTORIES = {
    torch.scalar_tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.range, torch.linspace,
    torch.logspace, torch.eye, torch.rand, torch.randn, torch.randint, torch.randperm, torch.empty_strided,
    torch.tril_indices, torch.triu_indices,
}
# Conversions: a tensor given stays where it is (as on CUDA); anything else (a list, a numpy array) is made on the host.
CONVERSIONS = {torch.tensor, torch.as_tensor, torch.asarray}
# Operations whose index argument CUDA requires on the device, whatever its size.
INDEXING = {
    torch.index_select, torch.Tensor.index_select, torch.Tensor.index_add_, torch.Tensor.index_add, torch.index_add,
    torch.Tensor.index_copy_, torch.Tensor.index_copy, torch.Tensor.index_fill_, torch.Tensor.index_fill,
    torch.gather, torch.Tensor.gather, torch.Tensor.scatter_, torch.Tensor.scatter, torch.scatter,
    torch.Tensor.scatter_add_, torch.Tensor.scatter_add, torch.take, torch.nn.functional.embedding, torch.embedding,
}
MOVES = {torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu, torch.Tensor.type_as}
COPIES = {torch.Tensor.copy_}  # a copy between devices is allowed (it is how tensors move)
OWN = {torch.Tensor.__deepcopy__}  # a copy of one tensor, where it is (its other argument, the memo, is no operand)
TO_NUMPY = {torch.Tensor.numpy, torch.Tensor.__array__}  # CUDA: "can't convert cuda:0 device type tensor to numpy"
DEVICE_OF = torch.Tensor.device.__get__  # `x.device`: a host tensor's names the host (`.to(x.device)` stays there)


class DeviceFault(RuntimeError):
    """An operation CUDA would refuse: a host tensor (made where `site` says) meets a device tensor."""


def _tag(value) -> str | None:
    """DEVICE, HOST, BEFORE (alive when the check was entered, or made from such tensors only), or None (born where
    the check could not see it: a host tensor)."""
    if not isinstance(value, torch.Tensor):
        return None
    seen = getattr(value, _TAG, None)
    if seen is not None and seen[0] == _generation[0]:
        return seen[1]
    return BEFORE if id(value) in _before else None  # a tag an earlier check left on a cached tensor is not this one's


def _site_of(value) -> str | None:
    seen = getattr(value, _TAG, None) if isinstance(value, torch.Tensor) else None
    return seen[2] if seen is not None and seen[0] == _generation[0] else None


def _set(value, tag: str | None, site: str | None = None):
    if isinstance(value, torch.Tensor):
        if tag is None:
            return
        try:
            setattr(value, _TAG, (_generation[0], tag, site))
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
    frame = sys._getframe(1)
    for _ in range(16):
        if frame is None:
            break
        name = frame.f_code.co_filename
        if "/torch/" not in name and name != __file__:
            return f"{name}:{frame.f_lineno} ({linecache.getline(name, frame.f_lineno).strip()})"
        frame = frame.f_back
    return "unknown"


def _named(device) -> str | None:
    """What a device named by `device=` or `.to(...)` makes of a tensor: HOST for the CPU named without an index
    ("cpu", torch.device("cpu")), DEVICE for any other (MODEL_DEVICE, cuda), None for meta (transformers builds a model
    there, then loads its weights) or no device."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "meta":
        return None
    return HOST if device.type == "cpu" and device.index is None else DEVICE


def _real(device):
    """The device torch is given for `device`: the CPU for MODEL_DEVICE (a name only the check gives it: torch would
    copy a CPU tensor `.to("cpu:0")`, where on a GPU machine `.to(device)` of a tensor already there returns it)."""
    if isinstance(device, (str, torch.device)) and torch.device(device) == MODEL_DEVICE:
        return CPU
    return device


def _is_host(tensor: torch.Tensor) -> bool:
    """Host by tag (or by having none: born unseen), and really in the CPU's memory."""
    return _tag(tensor) in (HOST, None) and tensor.device.type == "cpu"


def _host_factory(factory):
    """`factory` (torch.from_numpy, frombuffer: no TorchFunctionMode sees them), its result tagged as a host tensor."""
    @functools.wraps(factory)
    def made(*args, **kwargs):
        out = factory(*args, **kwargs)
        _set(out, HOST, _site())
        return out
    return made


def _rebuilt(rebuild):
    """torch.multiprocessing's rebuild_tensor (a DataLoader worker's batch, unpickled here): it makes the tensor with
    `device=` its storage's, so the check would see a device tensor; one in the CPU's memory is a host tensor.
    (functools.wraps: a forked worker pickles this very function by its name.)"""
    @functools.wraps(rebuild)
    def made(*args, **kwargs):
        out = rebuild(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.device.type == "cpu":
            _set(out, HOST, _site())
        return out
    return made


def _from_dlpack(factory):
    """torch.from_dlpack: a host tensor unless what it wraps is a tensor the check knows, or a device was named."""
    @functools.wraps(factory)
    def made(source, *args, **kwargs):
        out = factory(source, *args, **kwargs)
        named = _named(kwargs.get("device"))
        if named == DEVICE or named is None and _tag(source) == DEVICE:
            _set(out, DEVICE)
        else:
            _set(out, HOST, _site_of(source) or _site())
        return out
    return made


def _make_subclass(make):
    """torch.Tensor._make_subclass (nn.Parameter, nn.Buffer): the new object keeps the tag of the tensor it wraps."""
    def made(cls, data, *args, **kwargs):
        out = make(cls, data, *args, **kwargs)
        _set(out, _tag(data), _site_of(data))
        return out
    return staticmethod(made)


# (namespace, name, wrapper): creations no TorchFunctionMode sees, replaced while a DeviceCheck is entered
_PATCHES = [(torch, "from_numpy", _host_factory), (torch, "frombuffer", _host_factory),
            (torch, "from_dlpack", _from_dlpack), (torch.utils.dlpack, "from_dlpack", _from_dlpack),
            (torch.multiprocessing.reductions, "rebuild_tensor", _rebuilt), (torch.Tensor, "_make_subclass", _make_subclass)]
_active: list[DeviceCheck] = []
_generation = [0]  # counts outermost entries: a tag an earlier check left on a cached tensor is not this one's
_before: set[int] = set()  # the ids of the tensors alive when the outermost check was entered
TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_saved: list[tuple[object, str, object, bool]] = []


class DeviceCheck(TorchFunctionMode):
    """Inside `with DeviceCheck():`, device faults fail as on a GPU (module docstring); `faults` lists them all, also
    those some code caught."""

    def __init__(self) -> None:
        super().__init__()
        self.faults: list[str] = []

    def __enter__(self):
        if not _active:
            _generation[0] += 1
            _before.clear()
            _before.update(id(o) for o in gc.get_objects() if type(o) in TENSOR_TYPES)
            for namespace, name, wrap in _PATCHES:
                own = name in vars(namespace)
                original = getattr(namespace, name)
                _saved.append((namespace, name, vars(namespace).get(name), own))
                setattr(namespace, name, wrap(original))
        _active.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _active.remove(self)
            if not _active:
                _before.clear()
                while _saved:
                    namespace, name, original, own = _saved.pop()
                    if own:
                        setattr(namespace, name, original)
                    else:
                        delattr(namespace, name)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in MOVES:
            return self._move(func, args, kwargs)
        if func == DEVICE_OF:  # a device tensor's names the model's device; any other's (the CPU) the host
            out = func(*args, **kwargs)
            return MODEL_DEVICE if out.type == "cpu" and _tag(args[0]) == DEVICE else out
        inputs = args[:1] if func in OWN else [*_tensors(args), *_tensors(kwargs)]
        tags = {_tag(t) for t in inputs}
        device = DEVICE in tags
        if device and func in TO_NUMPY and args[0].device.type == "cpu":
            self._fault(f"{func.__name__}() of a tensor on the model's device: on a GPU this fails (can't convert "
                        f"cuda:0 device type tensor to numpy; .cpu() first)")
        if func in FACTORIES:
            device = False
        elif device and func not in COPIES and func not in CONVERSIONS:
            self._check(func, args, inputs)
        named = _named(kwargs.get("device"))
        out = func(*args, **{**kwargs, "device": _real(kwargs["device"])} if "device" in kwargs else kwargs)
        if func in COPIES:  # copy_ returns its own (tagged) self
            return out
        if named == DEVICE:
            _set(out, DEVICE)
        elif named == HOST:  # device="cpu": made on the host, whatever it was made from
            _set(out, HOST, _site())
        elif device:
            _set(out, DEVICE)
        elif tags == {BEFORE}:
            _set(out, BEFORE)
        elif next(_tensors(out), None) is not None:  # made or computed on the host: the site of what it came from
            _set(out, HOST, next(filter(None, map(_site_of, inputs)), None) or _site())
        return out

    def _move(self, func, args, kwargs):
        out = func(*map(_real, args), **{key: _real(value) for key, value in kwargs.items()})
        if func is torch.Tensor.cpu:
            _set(out, HOST, _site())
        elif func is torch.Tensor.cuda:
            _set(out, DEVICE)
        elif func is torch.Tensor.type_as:
            tags = (_tag(args[1]), _tag(args[0]))
            _set(out, DEVICE if DEVICE in tags else tags[1] or HOST, _site_of(args[0]))
        else:  # Tensor.to(device | other | dtype, ...): a device or another tensor names where it goes
            where = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device, torch.Tensor))),
                                              None))
            if isinstance(where, torch.Tensor):
                _set(out, _tag(where) or HOST, _site_of(where))
            elif where is not None and _named(where) == HOST:  # .to("cpu"), .to(x.device) of a host x
                _set(out, HOST, _site_of(args[0]) or _site())
            elif where is not None:
                _set(out, DEVICE)
            else:  # a dtype only: where it was
                tag = _tag(args[0]) or HOST
                _set(out, tag, (_site_of(args[0]) or _site()) if tag == HOST else None)
        return out

    def _check(self, func, args, inputs) -> None:
        indexing = func in INDEXING
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__):
            # x[i]: CUDA takes host index tensors; x[i] = v: v is copied (basic i) or must be on x's device (tensors in i)
            index = [id(t) for t in _tensors(args[1])]
            advanced = func is torch.Tensor.__setitem__ and bool(index)
            inputs = [t for t in inputs if id(t) not in index and (advanced or t is args[0])]
        hosts = [t for t in inputs if _is_host(t) and (t.dim() > 0 or indexing)]
        if hosts:
            name = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
            where = _site_of(hosts[0])
            made = f"made at {where}" if where else UNSEEN.format(_site())
            self._fault(f"{name}: a tensor on the host (shape {tuple(hosts[0].shape)}, {made}) meets the model's "
                              f"device: on a GPU this fails (Expected all tensors to be on the same device)")

    def _fault(self, fault: str) -> None:
        self.faults.append(fault)
        raise DeviceFault(fault)
