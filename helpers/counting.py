"""The work of one training step, counted: FLOPs, bytes each operator moves, operators launched, bytes copied to the
device (taught in notebook 08; ``helpers.predictions`` turns the counts into a predicted step time).

FLOPs come from PyTorch's ``FlopCounterMode`` (matrix products, convolutions, attention; one multiply-add = 2
FLOPs), plus analytic counts (``ANALYTIC_OPS``) for the kernels it has no formula for: cuDNN's ``_cudnn_rnn``,
oneDNN's ``mkldnn_rnn_layer`` and the CPU flash-attention kernel. ``aten.lstm`` never reaches a dispatch mode (it
becomes one of those kernels, or matrix products already counted), and ``_thnn_fused_lstm_cell`` does only the
elementwise gate arithmetic. Elementwise arithmetic is not counted: FLOPs here are the matrix-engine work that MFU
divides by a peak. Bytes are what an *unfused* eager step moves: an upper bound on what a fused program needs
(notebook 08), a lower bound for a kernel that re-reads its inputs.

Counting costs time (a Python call per operator): count once per run, outside any timed region.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from .step import train_step

aten = torch.ops.aten
GATES = {0: 1, 1: 1, 2: 4, 3: 3}   # cuDNN/oneDNN RNN mode -> gates: RNN_RELU, RNN_TANH, LSTM (i, f, g, o), GRU (r, z, n)
_ALLOCATIONS = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided}
_COPIES = {aten._to_copy, aten.copy_, aten._copy_from, aten._copy_from_and_resize}
# In-place operators whose destination is written, never read (position of the destination argument): an operator
# like ``add_`` reads ``self`` and writes it back, but ``copy_`` and ``fill_`` only write theirs.
_WRITE_ONLY = {aten.copy_: 0, aten.fill_: 0, aten.zero_: 0, aten._copy_from: 1, aten._copy_from_and_resize: 1}


def rnn_flops(input_size: int, hidden_size: int, *, steps: int, mode: str | int = "lstm", num_layers: int = 1,
              bidirectional: bool = False, proj_size: int = 0) -> int:
    """Forward FLOPs of a stacked (Bi)RNN/LSTM/GRU over ``steps`` (sequence, time) positions (notebook 08).

    Per layer, direction and position: the gate pre-activations ``W_ih x + W_hh h`` are ``G·H`` outputs of
    ``I_l + H_r`` inputs each, ``2·G·H·(I_l + H_r)`` FLOPs, with ``G`` gates (LSTM 4, GRU 3, plain RNN 1), ``I_l``
    the layer's input width (``input_size``, then ``H_out × directions``) and ``H_r`` the recurrent width (``H``, or
    ``proj_size`` with a projection, which adds ``2·H·P``). Biases and the elementwise gate arithmetic are left out,
    as ``FlopCounterMode`` leaves them out of a ``Linear``. ``steps`` is ``T × B`` for padded input, or the sum of
    the lengths (``sum(batch_sizes)``) for a packed sequence: padded positions of a packed sequence never run.
    """
    gates = GATES[{"rnn_relu": 0, "rnn_tanh": 1, "rnn": 1, "lstm": 2, "gru": 3}[mode] if isinstance(mode, str)
                  else mode]
    out = proj_size or hidden_size
    directions = 2 if bidirectional else 1
    total, width = 0, input_size
    for _ in range(num_layers):
        per_step = 2 * gates * hidden_size * (width + out) + (2 * hidden_size * proj_size if proj_size else 0)
        total += directions * steps * per_step
        width = out * directions
    return total


def _steps(input_shape) -> int:
    """Positions an RNN kernel runs: every row of a packed ``(sum(lengths), I)`` or a padded ``(T, B, I)`` input."""
    n = 1
    for d in input_shape[:-1]:
        n *= d
    return n


RECURRENT = (aten._cudnn_rnn, aten._cudnn_rnn_backward, aten.mkldnn_rnn_layer, aten.mkldnn_rnn_layer_backward)


def _cudnn_rnn_flop(input, weight, weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size, num_layers,
                    batch_first, dropout, train, bidirectional, *args, out_shape=None, **kwargs) -> int:
    return rnn_flops(input[-1], hidden_size, steps=_steps(input), mode=mode, num_layers=num_layers,
                     bidirectional=bidirectional, proj_size=proj_size)


def _cudnn_rnn_backward_flop(input, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy,
                             grad_cy, mode, hidden_size, proj_size, num_layers, batch_first, dropout, train,
                             bidirectional, batch_sizes, dropout_state, reserve, output_mask, *args, out_shape=None,
                             **kwargs) -> int:
    """cuDNN's backward always computes the data gradients (one forward's worth of products, the recurrence needs
    them) and the weight gradients (one more) when ``output_mask[3]`` asks for them."""
    forward = rnn_flops(input[-1], hidden_size, steps=_steps(input), mode=mode, num_layers=num_layers,
                        bidirectional=bidirectional, proj_size=proj_size)
    return forward * (1 + bool(output_mask[3]))


def _mkldnn_layer_flop(input, w_ih, w_hh, *args, out_shape=None, **kwargs) -> int:
    """oneDNN runs one layer and one direction per call: ``2·steps·(G·H)·(I + H)`` from the weights' shapes."""
    return 2 * _steps(input) * w_ih[0] * (w_ih[1] + w_hh[1])


def _mkldnn_layer_backward_flop(input, w_ih, w_hh, *args, out_shape=None, **kwargs) -> int:
    """Data and weight gradients of one oneDNN layer: twice its forward products."""
    return 2 * _mkldnn_layer_flop(input, w_ih, w_hh)


def _cpu_flash_flop(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _cpu_flash_backward_flop(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


# Operators FlopCounterMode has no formula for, and the analytic count used instead (formulas take shapes).
ANALYTIC_OPS = {
    aten._cudnn_rnn: _cudnn_rnn_flop,
    aten._cudnn_rnn_backward: _cudnn_rnn_backward_flop,
    aten.mkldnn_rnn_layer: _mkldnn_layer_flop,
    aten.mkldnn_rnn_layer_backward: _mkldnn_layer_backward_flop,
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flop,
}


def _time_steps(packet, args) -> int:
    """Sequential steps of a fused recurrent operator: its time steps (times its layers, for cuDNN's one call over
    all layers). Each depends on the one before, so they cannot run as one kernel: counted as one launch each."""
    if packet in (aten.mkldnn_rnn_layer, aten.mkldnn_rnn_layer_backward):
        return int(args[0].shape[0])  # oneDNN: one layer and direction per call, input (T, B, I)
    backward = packet is aten._cudnn_rnn_backward
    layers, batch_first, batch_sizes = (args[13], args[14], args[18]) if backward else (args[9], args[10], args[14])
    steps = len(batch_sizes) if batch_sizes is not None and len(batch_sizes) else args[0].shape[1 if batch_first else 0]
    return int(steps) * int(layers)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements of ``t``: a broadcast (stride 0) dimension is stored once (notebook 08)."""
    if t.numel() == 0:
        return 0
    try:
        n = 1
        for size, stride in zip(t.shape, t.stride()):
            n *= size if stride != 0 else 1
    except RuntimeError:  # sparse and other layouts without strides
        n = t.numel()
    return n * t.element_size()


def _distinct(tree) -> list:
    seen, found = set(), []
    for t in tree_leaves(tree):
        if isinstance(t, torch.Tensor):
            key = (t.data_ptr() if t.device.type != "meta" else id(t), tuple(t.shape), tuple(t.stride()), t.dtype)
            if key not in seen:
                seen.add(key)
                found.append(t)
    return found


def _reads_and_writes(func, packet, args, kwargs) -> tuple:
    """The arguments an operator reads, and those it writes in place: a destination it only writes (an ``out=``
    argument, the ``self`` of ``copy_``/``fill_``/``zero_``) is not read; an in-place update (``add_``, the
    ``_foreach_*_`` operators, which return nothing) reads and writes its ``self``."""
    schema, skip = func._schema.arguments, _WRITE_ONLY.get(packet)
    written = [a.name for a in schema if a.alias_info is not None and a.alias_info.is_write]
    outs = {a.name for a in schema if a.is_out}
    reads = (tuple(v for i, v in enumerate(args) if i != skip and not (i < len(schema) and schema[i].is_out)),
             {k: v for k, v in kwargs.items() if k not in outs})
    writes = [v for i, v in enumerate(args) if i < len(schema) and schema[i].name in written]
    writes += [v for k, v in kwargs.items() if k in written]
    return reads, writes


def _dtype_of(tensors) -> str:
    """The dtype that sets an operator's arithmetic: its first floating-point tensor's (else its first tensor's)."""
    floats = [t for t in tensors if t.is_floating_point()]
    pick = floats[0] if floats else (tensors[0] if tensors else None)
    return str(pick.dtype).removeprefix("torch.") if pick is not None else "none"


class WorkCounter(TorchDispatchMode):
    """A dispatch mode recording each ATen operator: FLOPs (from ``registry``), bytes in + out, host→device bytes.

    ``registry`` is a ``FlopCounterMode``'s ``flop_registry``, so the per-operator FLOPs are the counter's own.
    Operators without a FLOP formula that have a composite decomposition are decomposed first, as
    ``FlopCounterMode`` does, so that both see the same operators (notebook 08).
    """

    def __init__(self, registry: dict):
        super().__init__()
        self.registry, self.rows, self.analytic = registry, Counter(), Counter()
        self.ops = self.kernels = self.h2d_bytes = self.d2h_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet not in self.registry:
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        self._record(func, packet, args, kwargs, out)
        return out

    def _record(self, func, packet, args, kwargs, out) -> None:
        reads, writes = _reads_and_writes(func, packet, args, kwargs)
        inputs, outputs = _distinct(reads), _distinct((out, writes))
        flops = self.registry[packet](*args, **kwargs, out_val=out) if packet in self.registry else 0
        kernel = not func.is_view and packet not in _ALLOCATIONS
        nbytes = sum(map(tensor_bytes, inputs + outputs)) if kernel else 0
        self.ops += 1
        self.kernels += (_time_steps(packet, args) if packet in RECURRENT else 1) if kernel else 0
        if packet in ANALYTIC_OPS:
            self.analytic[str(packet)] += flops
        if packet in _COPIES and inputs and outputs:
            src, dst = inputs[0].device.type, outputs[0].device.type  # inputs: what is read, the source
            moved = tensor_bytes(outputs[0])
            self.h2d_bytes += moved if src == "cpu" and dst != "cpu" else 0
            self.d2h_bytes += moved if src != "cpu" and dst == "cpu" else 0
        self.rows[(str(packet), _dtype_of(inputs or outputs), int(flops), int(nbytes), kernel)] += 1


@dataclass
class StepWork:
    """What one training step does, counted (``count_step``); ``rows`` group identical operator calls (notebook 08).

    ``flops`` come from ``FlopCounterMode`` (``analytic``: the part counted by ``ANALYTIC_OPS``, per operator);
    ``bytes`` is the unfused traffic (each operator's inputs read once and outputs written once); ``ops`` every ATen
    operator dispatched (the host's work), ``kernels`` those that touch data (views and bare allocations excluded:
    on a GPU, roughly the kernels launched; a fused recurrent operator counts one per time step, ``_time_steps``); ``h2d_bytes`` what the step copied host→device and ``input_bytes``
    what a GPU run would copy (the batch, less the inputs kept on the host).
    """

    device: str
    items: int
    flops: int
    bytes: int
    ops: int
    kernels: int
    h2d_bytes: int
    d2h_bytes: int
    input_bytes: int
    analytic: dict = field(default_factory=dict)
    flops_by_op: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)

    def state_dict(self) -> dict:
        """Plain data, JSON-ready."""
        return asdict(self)


def _foreach(optimizer) -> None:
    """Let the optimizer's groups that leave the choice to PyTorch (``foreach=None``, not fused) run the foreach
    kernels, as on a GPU: torch.optim's own default (optimizer.py, ``_default_to_fused_or_foreach``) picks foreach
    when every parameter is on a device with foreach kernels (CUDA, not a CPU) and the optimizer is not
    differentiable."""
    for group in optimizer.param_groups:
        if "foreach" in group and group["foreach"] is None and not group.get("fused") \
                and not group.get("differentiable"):
            group["foreach"] = True


def count_step(model: nn.Module, batch, device: str | torch.device = "cpu", *, optimizer=None, loss_fn=None,
               amp=False, host_inputs=(), channels_last: bool = False, warmup: int = 1,
               foreach: bool = False) -> StepWork:
    """Count the FLOPs, bytes, operators and host→device bytes of one training step of ``model`` (notebook 08).

    The step is ``helpers.step.train_step``'s, with ``time_train_step``'s arguments, on ``batch = (*inputs,
    target)`` copied from the host inside the counted step (as ``fit`` does). It runs on a *copy* of model and
    optimizer, so the model you pass is not trained; ``warmup`` uncounted steps first create the optimizer's state.
    ``foreach=True`` counts the optimizer as it runs on a CUDA GPU: ``torch.optim`` picks its foreach kernels there
    (a few operators over all parameters) and a for-loop (operators per parameter) on a CPU; use it for a count made
    on a CPU that predicts a GPU (``helpers.predictions``).
    """
    prepared = train_step(model, optimizer, batch, device, loss_fn=loss_fn, amp=amp, host_inputs=host_inputs,
                          channels_last=channels_last, copy=True)
    if foreach:
        _foreach(prepared.optimizer)
    device, host = prepared.device, prepared.host
    step = lambda: prepared(host)  # noqa: E731 - the copy from the host is part of the counted step
    for _ in range(warmup):
        step()
    with FlopCounterMode(display=False, custom_mapping=ANALYTIC_OPS) as flop_counter:
        with WorkCounter(flop_counter.flop_registry) as counter:
            step()
    return _work(counter, flop_counter, device, host, host_inputs)


def _work(counter: WorkCounter, flop_counter: FlopCounterMode, device, host, host_inputs) -> StepWork:
    rows = [{"op": op, "dtype": dt, "flops": f, "bytes": b, "kernel": k, "calls": n}
            for (op, dt, f, b, k), n in counter.rows.items()]
    rows.sort(key=lambda r: (r["flops"] * r["calls"], r["bytes"] * r["calls"]), reverse=True)
    moved = [x for i, x in enumerate(host[:-1]) if i not in host_inputs and isinstance(x, torch.Tensor)] + [host[-1]]
    return StepWork(device=str(device), items=int(host[-1].shape[0]), flops=int(flop_counter.get_total_flops()),
                    bytes=sum(r["bytes"] * r["calls"] for r in rows), ops=counter.ops, kernels=counter.kernels,
                    h2d_bytes=counter.h2d_bytes, d2h_bytes=counter.d2h_bytes,
                    input_bytes=sum(map(tensor_bytes, moved)), analytic=dict(counter.analytic),
                    flops_by_op={str(k): int(v) for k, v in flop_counter.get_flop_counts().get("Global", {}).items()},
                    rows=rows)


def count_fn(fn, *args, **kwargs) -> StepWork:
    """Count what one call ``fn(*args, **kwargs)`` does (FLOPs, bytes, operators), as ``count_step`` counts a
    training step; ``items`` is 1 and ``input_bytes`` the tensors passed in (notebook 03)."""
    with FlopCounterMode(display=False, custom_mapping=ANALYTIC_OPS) as flop_counter:
        with WorkCounter(flop_counter.flop_registry) as counter:
            fn(*args, **kwargs)
    tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    work = _work(counter, flop_counter, torch.device("cpu"), (torch.zeros(1),), ())
    work.input_bytes = sum(map(tensor_bytes, tensors))
    return work
