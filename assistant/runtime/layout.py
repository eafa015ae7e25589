"""Memory layout of the target's linear weights: which BLAS path a matmul takes.

Contract: `set_layout(model, layout)` re-strides every floating-point nn.Linear weight
of `model` in place and returns how many tensors it converted. "out" is the layout
transformers loads ([out, in] contiguous); "in" stores the same values [in, out]
contiguous, with `weight` an [out, in] view of it, so `F.linear` runs `x @ W^T` on a
contiguous matrix. "packed" (CPU only) reorders each weight once into oneDNN's blocked
format and runs the module through the custom op `assistant::packed_linear` (traceable by
torch.compile, which calls it as one opaque kernel); a bf16 or fp32 weight the native kernel takes
(assistant.runtime.kernels: bf16 and fp32 on AVX512-BF16 CPUs, fp32 on AVX512F or AVX2 + FMA ones, built
on this machine) is packed for it instead and runs through `assistant_kernels::linear`, a C++ op with no Python
on its way; sibling linears that read one input (GROUPS: q/k/v, gate/up) share one packed weight and
one GEMM, each taking its columns of the product (`DedupPackedLinear` merges their calls in a compiled
graph); an fp32 weight that was dequantized from blocks of 32 inputs (the embedded default's GGUF) is packed
in that block form (assistant.runtime.kernels.blocks: 0.75-1.25 bytes a weight, the same products bit for bit;
`block_keys`); the dense `weight` becomes a zero-stride placeholder of the same shape, except where the tensor
is shared with an embedding (SmolLM2's tied output layer), so memory stays that of one copy. Values,
shapes, parameter identity and weight tying are unchanged, the modeling code is
untouched, and every layout converts back to every other exactly (`to_dense` of a
packed weight is the original). The other CPU tensors are copied too, so the
memory-mapped checkpoint is released. `layout_of(model)` reads it back.

Why: on an x86 CPU in fp32, MKL's sgemm repacks an [out, in] weight on every call
with 4 or more rows, so a 16-node tree verify cost x3.0 a 1-row forward on SmolLM2-
135M; with [in, out] weights it cost x1.75 and the 1-row forward itself got 13%
faster. In bf16 there the "in" layout was slower at every width, so which one pays
is measured per device by assistant.runtime.costmodel, not assumed. Why "packed": a bf16 F.linear
on a CPU reorders its [out, in] weight inside oneDNN on every call; done once, the
576x1536 MLP GEMV went from 62 to 39 us and SmolLM2's 49,152-row output layer from 2.8
to 1.4 ms (2 threads, avx512_bf16), the same kernel inductor's `freezing` would pick,
without freezing's price (no on-disk cache: a 72 s compile at every start).
"""
from __future__ import annotations

import collections
import weakref

import torch
import torch.fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

LAYOUTS = ("out", "in", "packed")
_PACKED: dict[int, torch.Tensor] = {}     # key -> packed weight, read by assistant::packed_linear (oneDNN)
_NATIVE: set[int] = set()                  # keys packed for assistant_kernels::linear instead (kernels/)
_next_key = 0
_next_side_key = 1 << 40                   # keys of modules no compiled graph reads (set_layout's `side`)


_LIB = torch.library.Library("assistant", "DEF")
_LIB.define("packed_linear(Tensor x, int key, int out_features) -> Tensor")


def packed_linear(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    """x [..., in] @ W^T -> [..., out] with W the packed weight registered under `key`. A plain
    Library kernel, not torch.library.custom_op (3 us less per call), calling the cached overload
    on x's own shape (oneDNN takes any leading dims; 2.7 us less than a reshape and the packet):
    211 calls a SmolLM2 pass."""
    return _LINEAR(x if x.is_contiguous() else x.contiguous(), _PACKED[key], None, "none", [], "")


_LINEAR = torch.ops.mkldnn._linear_pointwise.default if torch.backends.mkldnn.is_available() else None
_LIB.impl("packed_linear", packed_linear, "CPU")


@torch.library.register_fake("assistant::packed_linear", lib=_LIB)
def _(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


def _packed_op(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    """The op of the weight under `key`: the native kernel (no Python on its way, in a graph or not)
    or oneDNN's through assistant::packed_linear."""
    if key in _NATIVE:
        return torch.ops.assistant_kernels.linear(x, key, out_features)
    return torch.ops.assistant.packed_linear(x, key, out_features)


def _native_pack(dense: torch.Tensor) -> torch.Tensor | None:
    """`dense` packed for the native kernel, or None where it does not run (another dtype or shape,
    bf16 on a CPU without AVX512-BF16, no compiler): oneDNN packs it then."""
    from assistant.runtime import kernels

    if not (kernels.usable(dense) and kernels.load()):
        return None
    if dense.dtype == torch.float32 and dense.shape[1] % 32 == 0 and kernels.blocks_enabled():
        found = torch.ops.assistant_kernels.pack_blocks(dense)
        if found.numel():
            return found
    return torch.ops.assistant_kernels.pack(dense)


def _native_unpack(packed: torch.Tensor, k: int) -> torch.Tensor:
    if packed.dtype == torch.int8:
        from assistant.runtime.kernels import blocks

        return blocks.unpack(packed, k)
    return torch.ops.assistant_kernels.unpack(packed)


def _forget(key: int) -> None:
    _PACKED.pop(key, None)
    if key in _NATIVE:
        _NATIVE.discard(key)
        torch.ops.assistant_kernels.drop(key)


def packing_supported(model) -> bool:
    """The packed layout needs oneDNN and CPU weights in fp32 or bf16, and this CPU must pack that dtype:
    oneDNN's bf16 packing needs avx512bw/vl/dq or avx_ne_convert (an avx2-only CPU refuses it)."""
    ws = _weights(model)
    if not (ws and torch.backends.mkldnn.is_available() and all(
            w.device.type == "cpu" and w.dtype in (torch.float32, torch.bfloat16) for w in ws)):
        return False
    return all(_packs(dtype) for dtype in {w.dtype for w in ws})


_PACKS: dict[torch.dtype, bool] = {}


def _packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs a linear weight of `dtype` on this CPU (tried once on a tiny weight)."""
    if dtype not in _PACKS:
        try:
            torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 1)
            _PACKS[dtype] = True
        except RuntimeError:
            _PACKS[dtype] = False
    return _PACKS[dtype]


# Sibling linears that transformers' decoder layers (Llama, Qwen, Mistral, ...) call one after the other on
# the same input: packed as one weight, they run as one GEMM (oneDNN's fixed ~12 us a call, 90 calls fewer a
# SmolLM2 pass: 8.8 -> 7.5 ms of linears at w=1, 11.4 -> 9.6 at w=16 over 30 layers' weights streamed).
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _Group:
    """One packed weight for sibling linears: `key` and `total` output features, the members' column
    ranges, and (eager only) the last input's product, which the next members of the same call reuse."""

    __slots__ = ("key", "total", "size", "x", "version", "y", "left")

    def __init__(self, key: int, total: int, size: int):
        self.key, self.total, self.size = key, total, size
        self.x = self.y = None
        self.version, self.left = -1, 0

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] @ W_group^T -> [..., total]. Eager: the members called on the same unchanged x
        share one GEMM. Traced: every member calls the op and DedupPackedLinear merges the calls (a
        Python-side cache would be a side effect in the graph)."""
        if torch.compiler.is_compiling():
            return _packed_op(x, self.key, self.total)
        version = -1 if x.is_inference() else x._version    # inference tensors keep no version counter
        if self.left and self.x is x and self.version == version:
            y, self.left = self.y, self.left - 1
        else:
            y = _packed_op(x, self.key, self.total)
            self.x, self.version, self.y, self.left = x, version, y, self.size - 1
        if not self.left:
            self.x = self.y = None
        return y


def _packed_forward(self, x: torch.Tensor) -> torch.Tensor:
    """A packed linear's forward, bound to the module as its `forward` (the name it is found by when dynamo
    saves a compiled graph's guards: a bound method is pickled as getattr(module, its name))."""
    group, start = self._assistant_group, self._assistant_start
    if group is None:
        y = _packed_op(x, self._assistant_packed, self.out_features)
    else:
        y = group.product(x).narrow(-1, start, self.out_features)
    return y if self.bias is None else y + self.bias


_packed_forward.__name__ = "forward"


class DedupPackedLinear(CustomGraphPass):
    """Inductor post-grad pass: packed linear calls (either op) with the same input and key computed once
    (the members of a group each call it; inductor does not merge calls of an opaque op by itself)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        seen: dict[tuple, torch.fx.Node] = {}
        ops = {torch.ops.assistant.packed_linear.default}
        if hasattr(torch.ops, "assistant_kernels") and hasattr(torch.ops.assistant_kernels, "linear"):
            ops.add(torch.ops.assistant_kernels.linear.default)
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in ops:
                continue
            first = seen.setdefault((node.target, node.args, tuple(sorted(node.kwargs.items()))), node)
            if first is not node:
                node.replace_all_uses_with(first)
                graph.erase_node(node)

    def uuid(self) -> str:
        return get_hash_for_files((__file__,)).hex()

    def __repr__(self) -> str:     # stable across processes: it is part of a saved graph's key
        return "DedupPackedLinear"


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


def _groups(model, shared: set[int], linears: list[torch.nn.Linear]) -> list[list[torch.nn.Linear]]:
    """Every linear in a list: GROUPS' siblings together (same input size and dtype, weights not shared
    with anything), the rest alone, in module order."""
    out, done, ids = [], set(), {id(m) for m in linears}
    for parent in model.modules():
        for names in GROUPS:
            mods = [getattr(parent, n, None) for n in names]
            if all(isinstance(m, torch.nn.Linear) and id(m) in ids for m in mods) and len(
                    {(m.in_features, m.weight.dtype) for m in mods}) == 1 and not {id(m.weight) for m in mods} & shared:
                out.append(mods)
                done.update(id(m) for m in mods)
    out += [[m] for m in linears if id(m) not in done]
    return out


def _pack(model, side: bool = False) -> int:
    global _next_key, _next_side_key
    if not packing_supported(model):
        raise ValueError("the packed weight layout needs oneDNN and fp32/bf16 weights on the CPU")
    shared = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    todo = [m for m in _linears(model) if not _is_packed(m)]
    for mod in todo:
        if getattr(mod, "_assistant_key", None) is not None:   # one key per module for the life of the
            continue                                            # process: a compiled graph bakes it in
        if side:
            mod._assistant_key, _next_side_key = _next_side_key, _next_side_key + 1
        else:
            mod._assistant_key, _next_key = _next_key, _next_key + 1
    for members in _groups(model, shared, todo):
        key = members[0]._assistant_key
        dense = [m.weight.data.contiguous() for m in members]
        dense = dense[0] if len(dense) == 1 else torch.cat(dense)
        native = _native_pack(dense)
        if native is not None:
            _PACKED[key] = native
            _NATIVE.add(key)
            torch.ops.assistant_kernels.put(key, native)
        else:
            _PACKED[key] = torch.ops.mkldnn._reorder_linear_weight(dense, 1)
        del dense
        weakref.finalize(members[0], _forget, key)    # a dropped model does not leave its weights behind
        group = _Group(key, sum(m.out_features for m in members), len(members)) if len(members) > 1 else None
        start = 0
        for mod in members:
            w = mod.weight
            mod._assistant_packed, mod._assistant_group, mod._assistant_start = key, group, start
            start += mod.out_features
            mod.forward = _packed_forward.__get__(mod)
            if id(w) not in shared:   # the dense copy is no longer read: keep its shape, drop its memory
                w.data = torch.zeros(1, dtype=w.dtype).expand(w.shape)
            elif not w.is_contiguous():
                # the embedding still reads it: "packed" always leaves it [out, in], whatever layout came before,
                # because a compiled graph bakes in the strides of the tensors it reads
                w.data = w.data.contiguous()
    return len(todo)


def _unpack(model) -> int:
    mods = [m for m in _linears(model) if _is_packed(m)]
    left = collections.Counter(m._assistant_packed for m in mods)     # members still to read each weight
    dense: dict[int, torch.Tensor] = {}
    for mod in mods:
        key = mod._assistant_packed
        if key not in dense:
            packed = _PACKED[key]
            dense[key] = _native_unpack(packed, mod.in_features) if key in _NATIVE else packed.to_dense()
            _forget(key)
        w = dense[key]
        left[key] -= 1
        if not left[key]:
            del dense[key]          # only one group's dense copy is alive at a time
        if mod.weight.stride() == (0, 0):
            start = mod._assistant_start
            mod.weight.data = w if mod._assistant_group is None else w[start: start + mod.out_features].clone()
        mod._assistant_packed = mod._assistant_group = None
        del mod.forward
    return len(mods)


@torch.no_grad()
def set_layout(model, layout: str, side: bool = False) -> int:
    """Put `model`'s linear weights in `layout` ("out", "in" or "packed"); returns how many changed. `side`:
    a module no compiled graph reads (a drafter's head) takes its packed weights' keys from a range of its
    own, so packing it leaves the keys the target's next packing gets (and a compiled graph bakes in)
    as they would be without it."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown weight layout {layout!r}: choose {', '.join(LAYOUTS)}")
    if layout == "packed":
        changed = _pack(model, side)
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


def packed_columns(model) -> list[tuple[int, int, int]]:
    """(packed weight key, first column, columns) of each packed linear in module order: which GEMM each
    linear's output comes from, which a compiled graph bakes in as well."""
    return [(int(m._assistant_packed), int(m._assistant_start), int(m.out_features)) for m in _linears(model)
            if _is_packed(m)]


def native_keys(model) -> list[int]:
    """The keys of `model`'s packed weights that run on the native kernel (a compiled graph calls another op
    for them, so a saved one is valid only where the same keys do)."""
    return sorted({int(m._assistant_packed) for m in _linears(model) if _is_packed(m)} & _NATIVE)


def block_keys(model) -> list[int]:
    """The keys of `model`'s packed weights held in block form (assistant.runtime.kernels.blocks)."""
    return [k for k in native_keys(model) if _PACKED[k].dtype == torch.int8]


def start_keys_at(first: int) -> None:
    """Number the next packed linears from `first` on: a process that compiles a graph for another
    process's model (assistant.runtime.background) gives its copy the same keys, which the graph bakes in."""
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
