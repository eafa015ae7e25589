"""Memory layout of the target's linear weights: which BLAS path a matmul takes.

Contract: `set_layout(model, layout)` re-strides every floating-point nn.Linear weight
of `model` in place and returns how many tensors it converted. "out" is the layout
transformers loads ([out, in] contiguous); "in" stores the same values [in, out]
contiguous, with `weight` an [out, in] view of it, so `F.linear` runs `x @ W^T` on a
contiguous matrix. "packed" (CPU only) reorders each weight once into oneDNN's blocked
format and runs the module through the custom op `assistant::packed_linear` (traceable by
torch.compile, which calls it as one opaque kernel); the dense `weight` becomes a
zero-stride placeholder of the same shape, except where the tensor is shared with an
embedding (SmolLM2's tied output layer), so memory stays that of one copy. Values,
shapes, parameter identity and weight tying are unchanged, the modeling code is
untouched, and every layout converts back to every other exactly (`to_dense` of a
packed weight is the original). The other CPU tensors are copied too, so the
memory-mapped checkpoint is released. `layout_of(model)` reads it back.

Why: on an x86 CPU in fp32, MKL's sgemm repacks an [out, in] weight on every call
with 4 or more rows, so a 16-node tree verify cost x3.0 a 1-row forward on SmolLM2-
135M; with [in, out] weights it cost x1.75 and the 1-row forward itself got 13%
faster. In bf16 there the "in" layout was slower at every width, so which one pays
is measured per device by runtime.costmodel, not assumed. Why "packed": a bf16 F.linear
on a CPU reorders its [out, in] weight inside oneDNN on every call; done once, the
576x1536 MLP GEMV went from 62 to 39 us and SmolLM2's 49,152-row output layer from 2.8
to 1.4 ms (2 threads, avx512_bf16), the same kernel inductor's `freezing` would pick,
without freezing's price (no on-disk cache: a 72 s compile at every start).
"""
from __future__ import annotations

import weakref

import torch

LAYOUTS = ("out", "in", "packed")
_PACKED: dict[int, torch.Tensor] = {}     # key -> oneDNN-packed weight, read by assistant::packed_linear
_next_key = 0


_LIB = torch.library.Library("assistant", "DEF")
_LIB.define("packed_linear(Tensor x, int key, int out_features) -> Tensor")


def packed_linear(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    """x [..., in] @ W^T -> [..., out] with W the packed weight registered under `key`. A plain
    Library kernel, not torch.library.custom_op: 3 us less per call (211 calls a SmolLM2 pass)."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), _PACKED[key], None, "none", [], "")
    return y.view(*x.shape[:-1], out_features)


_LIB.impl("packed_linear", packed_linear, "CPU")


@torch.library.register_fake("assistant::packed_linear", lib=_LIB)
def _(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


def packing_supported(model) -> bool:
    """The packed layout needs oneDNN and CPU weights in fp32 or bf16."""
    ws = _weights(model)
    return bool(ws) and torch.backends.mkldnn.is_available() and all(
        w.device.type == "cpu" and w.dtype in (torch.float32, torch.bfloat16) for w in ws)


def _packed_forward(self, x: torch.Tensor) -> torch.Tensor:
    y = torch.ops.assistant.packed_linear(x, self._assistant_packed, self.out_features)
    return y if self.bias is None else y + self.bias


def _weights(model) -> list[torch.nn.Parameter]:
    seen: dict[int, torch.nn.Parameter] = {}
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        if isinstance(mod, torch.nn.Linear) and isinstance(w, torch.nn.Parameter) and w.dtype.is_floating_point \
                and w.dim() == 2:
            seen.setdefault(id(w), w)
    return list(seen.values())


def _is_in(w: torch.Tensor) -> bool:
    return w.stride() == (1, w.shape[0]) and w.shape[0] > 1


def _linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)
            and isinstance(getattr(m, "weight", None), torch.nn.Parameter) and m.weight.dtype.is_floating_point
            and m.weight.dim() == 2]


def _is_packed(mod: torch.nn.Module) -> bool:
    return getattr(mod, "_assistant_packed", None) is not None


def _pack(model) -> int:
    global _next_key
    if not packing_supported(model):
        raise ValueError("the packed weight layout needs oneDNN and fp32/bf16 weights on the CPU")
    shared = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    changed = 0
    for mod in _linears(model):
        if _is_packed(mod):
            continue
        w = mod.weight
        key = getattr(mod, "_assistant_key", None)
        if key is None:   # one key per module for the life of the process: a compiled graph bakes it in
            key, _next_key = _next_key, _next_key + 1
            mod._assistant_key = key
        _PACKED[key] = torch.ops.mkldnn._reorder_linear_weight(w.data.contiguous(), 1)
        weakref.finalize(mod, _PACKED.pop, key, None)    # a dropped model does not leave its weights behind
        mod._assistant_packed = key
        mod.forward = _packed_forward.__get__(mod)
        if id(w) not in shared:   # the dense copy is no longer read: keep its shape, drop its memory
            w.data = torch.zeros(1, dtype=w.dtype).expand(w.shape)
        elif not w.is_contiguous():
            # the embedding still reads it: "packed" always leaves it [out, in], whatever layout came before,
            # because a compiled graph bakes in the strides of the tensors it reads
            w.data = w.data.contiguous()
        changed += 1
    return changed


def _unpack(model) -> int:
    changed = 0
    for mod in _linears(model):
        if not _is_packed(mod):
            continue
        key = mod._assistant_packed
        if mod.weight.stride() == (0, 0):
            mod.weight.data = _PACKED[key].to_dense()
        del _PACKED[key]
        mod._assistant_packed = None
        del mod.forward
        changed += 1
    return changed


@torch.no_grad()
def set_layout(model, layout: str) -> int:
    """Put `model`'s linear weights in `layout` ("out", "in" or "packed"); returns how many changed."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown weight layout {layout!r}: choose {', '.join(LAYOUTS)}")
    if layout == "packed":
        changed = _pack(model)
        if changed:   # copy what still points into the checkpoint's mapping (the tied embedding included)
            _own_cpu_storage(model, {id(w) for w in _weights(model) if w.stride() == (0, 0)})
            _return_freed_memory()
        return changed
    changed = _unpack(model)
    done: set[int] = set()
    for w in _weights(model):
        done.add(id(w))
        if _is_in(w) == (layout == "in"):
            continue
        w.data = w.data.t().contiguous().t() if layout == "in" else w.data.contiguous()
        changed += 1
    if changed:
        _own_cpu_storage(model, done)
        _return_freed_memory()
    return changed


def _return_freed_memory() -> None:
    """Give the freed old copies back to the OS. Most weights are under glibc's mmap threshold, so
    their old copies stay in the heap as free space that still counts as RSS (measured: bf16 SmolLM2
    649 -> 832 MB after a re-stride, 631 MB after malloc_trim)."""
    import ctypes
    import ctypes.util

    try:
        name = ctypes.util.find_library("c")
        if name:
            ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):   # not glibc
        pass


def _own_cpu_storage(model, skip: set[int]) -> None:
    """Copy the other CPU tensors too. transformers maps the checkpoint file into memory and every
    tensor is a view of that one mapping: while a single norm weight still points into it, the whole
    file stays resident next to the re-strided copies (measured: 900 -> 1,394 MB RSS for SmolLM2 fp32;
    880 MB once every tensor was copied)."""
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in skip and t.device.type == "cpu":
            t.data = t.data.clone()


def packed_keys(model) -> list[int]:
    """The `assistant::packed_linear` keys of `model`'s linears in module order, given at their first
    packing and kept (a compiled graph bakes them in, so a saved one is valid only for a model whose keys
    are the same)."""
    return [int(m._assistant_key) for m in _linears(model) if getattr(m, "_assistant_key", None) is not None]


def start_keys_at(first: int) -> None:
    """Number the next packed linears from `first` on: a process that compiles a graph for another
    process's model (runtime.precompile) gives its copy the same keys, which the graph bakes in."""
    global _next_key
    if _PACKED and first < _next_key:
        raise ValueError(f"packed keys below {_next_key} are in use in this process")
    _next_key = first


def layout_of(model) -> str:
    """"packed" when every linear runs packed, "in" when every linear weight is stored [in, out], else "out"."""
    lin = _linears(model)
    if lin and all(_is_packed(m) for m in lin):
        return "packed"
    ws = _weights(model)
    return "in" if ws and all(_is_in(w) for w in ws) else "out"
