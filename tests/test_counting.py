"""helpers.counting: the counts of a training step against analytic values (notebook 08)."""
import json

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.flop_counter import FlopCounterMode

from helpers import counting
from helpers.models import ConvBlockNet
from helpers.counting import ANALYTIC_OPS, WorkCounter, count_step, rnn_flops, tensor_bytes

aten = torch.ops.aten


def square_loss(out, target):
    """A loss with no matrix products of its own, so the step's FLOPs are the model's."""
    return out.square().mean()


@pytest.mark.parametrize("input_grad, passes", [(False, 2), (True, 3)])
def test_linear_counts_forward_and_backward(input_grad, passes):
    b, i, o = 8, 16, 4
    x = torch.randn(b, i, requires_grad=input_grad)
    work = count_step(nn.Linear(i, o), (x, torch.zeros(b)), loss_fn=square_loss)
    # forward 2·B·I·O; backward: weight gradient always, input gradient only when the input requires grad
    assert work.flops == passes * 2 * b * i * o
    assert work.analytic == {}
    assert sum(r["flops"] * r["calls"] for r in work.rows) == work.flops, "per-operator FLOPs add up to the total"


@pytest.mark.parametrize("input_grad, passes", [(False, 2), (True, 3)])
def test_conv2d_counts_forward_and_backward(input_grad, passes):
    b, c_in, c_out, k, hw = 4, 3, 8, 3, 10
    x = torch.randn(b, c_in, hw, hw, requires_grad=input_grad)
    model = nn.Sequential(nn.Conv2d(c_in, c_out, k, padding=1), nn.Flatten())
    work = count_step(model, (x, torch.zeros(b)), loss_fn=square_loss)
    forward = 2 * b * c_out * hw * hw * c_in * k * k  # "same" padding: the output is hw × hw
    assert work.flops == passes * forward
    assert work.flops_by_op.keys() == {"aten.convolution", "aten.convolution_backward"}


def test_a_chain_of_n_adds_is_n_operators():
    x = torch.zeros(1000)
    for n in (5, 12):
        with WorkCounter({}) as counter:
            y = x
            for _ in range(n):
                y = y + 1.0
        assert counter.ops == n and counter.kernels == n
        assert counter.rows[("aten.add", "float32", 0, 2 * 4000, True)] == n, counter.rows  # read x, write y


def _bytes(counter):
    return sum(nbytes * calls for (_, _, _, nbytes, _), calls in counter.rows.items())


def test_a_destination_only_written_counts_once():
    a, b, c = torch.randn(1000), torch.randn(1000), torch.empty(1000)
    size = 1000 * 4
    with WorkCounter({}) as counter:
        torch.add(a, b, out=c)  # read a and b, write c: c is not read
    assert _bytes(counter) == 3 * size, counter.rows
    with WorkCounter({}) as counter:
        c.copy_(a)  # read a, write c
    assert _bytes(counter) == 2 * size, counter.rows
    with WorkCounter({}) as counter:
        c.fill_(1.0)  # write c only
    assert _bytes(counter) == size, counter.rows
    with WorkCounter({}) as counter:
        c.add_(a)  # an in-place update reads c and writes it back: read c and a, write c
    assert _bytes(counter) == 3 * size, counter.rows
    with WorkCounter({}) as counter:
        torch.add(c, a, out=c)  # the destination is also an operand: read too
    assert _bytes(counter) == 3 * size, counter.rows
    with WorkCounter({}) as counter:
        torch._foreach_add_([c, b], [a, a])  # returns nothing: its updated list is read and written
    assert _bytes(counter) == 5 * size, counter.rows  # read c, b, a (once: the same tensor twice); write c, b


def test_foreach_counts_the_optimizer_as_on_a_gpu():
    # torch.optim runs a for-loop on CPU tensors (operators per parameter), foreach kernels on CUDA tensors
    model, batch = ConvBlockNet(depth=2), (torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)))
    for optimizer in (None, torch.optim.Adam):
        cpu = count_step(model, batch, optimizer=optimizer)
        gpu = count_step(model, batch, optimizer=optimizer, foreach=True)
        assert gpu.ops < cpu.ops and gpu.kernels < cpu.kernels, (cpu.ops, gpu.ops)
        assert gpu.flops == cpu.flops
        assert abs(gpu.bytes - cpu.bytes) < 1e-3 * cpu.bytes, "the same updates, in fewer operators"
        assert any(r["op"].startswith("aten._foreach") for r in gpu.rows)
        assert not any(r["op"].startswith("aten._foreach") for r in cpu.rows)


def test_views_move_no_bytes_and_are_not_kernels():
    x = torch.randn(6, 4)
    with WorkCounter({}) as counter:
        x.t()
        x.view(4, 6)
    assert counter.ops == 2 and counter.kernels == 0
    assert all(nbytes == 0 for (_, _, _, nbytes, _) in counter.rows)


def test_a_broadcast_tensor_is_stored_once():
    assert tensor_bytes(torch.randn(3, 1).expand(3, 1000)) == 3 * 4
    assert tensor_bytes(torch.randn(3, 1000)) == 3000 * 4


def test_host_to_device_bytes_are_counted():
    x = torch.randn(256)
    with WorkCounter({}) as counter:
        x.to("meta")  # a copy off the host, the same dispatch as .to("cuda")
        x.clone()     # a copy that stays on the host
    assert counter.h2d_bytes == 256 * 4 and counter.d2h_bytes == 0


class LastStep(nn.Module):
    """An unpacked LSTM (on a CPU: oneDNN's fused kernel, which FlopCounterMode cannot count) and a linear head."""

    def __init__(self, features, hidden, classes, layers=1, bidirectional=False):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (1 + bidirectional), classes)

    def forward(self, x):
        return self.head(self.lstm(x)[0][:, -1])


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN: the LSTM is decomposed")
@pytest.mark.parametrize("layers, bidirectional", [(1, False), (2, True)])
def test_lstm_gets_its_analytic_count(layers, bidirectional):
    b, t, i, h, k = 5, 7, 12, 20, 3
    model = LastStep(i, h, k, layers, bidirectional)
    work = count_step(model, (torch.randn(b, t, i), torch.randint(0, k, (b,))))
    forward = rnn_flops(i, h, steps=b * t, num_layers=layers, bidirectional=bidirectional)
    # per layer and direction: 2·steps·4H·(I_l + H); I_l = I, then 2H for the second bidirectional layer
    by_hand = 2 * b * t * 4 * h * (i + h) * (1 + bidirectional) + (layers - 1) * 2 * 2 * b * t * 4 * h * (2 * h + h)
    assert forward == by_hand > 0
    assert work.analytic == {"aten.mkldnn_rnn_layer": forward, "aten.mkldnn_rnn_layer_backward": 2 * forward}
    assert work.flops == 3 * forward + 3 * 2 * b * h * (1 + bidirectional) * k  # + the head, forward and backward


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN: the LSTM is decomposed")
def test_a_fused_recurrent_operator_counts_a_launch_per_time_step():
    """The time steps of a fused LSTM depend on each other: one kernel cannot run them, so each is counted."""
    b, t, i, h, k = 3, 11, 12, 20, 3
    work = count_step(LastStep(i, h, k, 1, True), (torch.randn(b, t, i), torch.randint(0, k, (b,))))
    fused = sum(r["calls"] for r in work.rows if "mkldnn_rnn_layer" in r["op"])
    assert fused == 4, "two directions, forward and backward: four fused calls"
    assert work.kernels >= fused * t and work.kernels < fused * t + 100
    from helpers.counting import _time_steps
    padded, packed = ((50, 8, 12), None), ((123, 12), None)
    fwd = lambda shape, batch_sizes, first=False: (torch.empty(shape), *[None] * 8, 2, first, 0.0, True, True,  # noqa
                                                   batch_sizes)
    assert _time_steps(aten._cudnn_rnn, fwd(*padded)) == 50 * 2
    assert _time_steps(aten._cudnn_rnn, fwd((8, 50, 12), None, True)) == 50 * 2
    assert _time_steps(aten._cudnn_rnn, fwd(packed[0], torch.tensor([4] * 30 + [3]))) == 31 * 2


def test_the_packed_lstm_formula_matches_the_counted_products():
    """Where PyTorch runs a packed LSTM as per-step matrix products, FlopCounterMode's count is the formula's."""
    lengths = torch.tensor([9, 4, 7, 2])
    lstm = nn.LSTM(6, 10, batch_first=True, bidirectional=True)
    packed = pack_padded_sequence(torch.randn(4, 9, 6), lengths, batch_first=True, enforce_sorted=False)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        lstm(packed)
    assert counter.get_total_flops() == rnn_flops(6, 10, steps=int(lengths.sum()), bidirectional=True)


def test_cudnn_rnn_formulas_from_shapes():
    """The cuDNN kernels (GPU only) counted from the shapes their dispatch sees: padded and packed input."""
    fwd, bwd = ANALYTIC_OPS[aten._cudnn_rnn], ANALYTIC_OPS[aten._cudnn_rnn_backward]
    common = dict(mode=2, hidden_size=32, proj_size=0, num_layers=2, batch_first=False, dropout=0.0, train=True,
                  bidirectional=True)
    expected = rnn_flops(12, 32, steps=50 * 8, num_layers=2, bidirectional=True)
    assert fwd((50, 8, 12), [], 4, None, (4, 8, 32), (4, 8, 32), **common) == expected
    assert fwd((123, 12), [], 4, None, (4, 8, 32), None, **common) == rnn_flops(12, 32, steps=123, num_layers=2,
                                                                                  bidirectional=True)
    rest = dict(batch_sizes=[], dropout_state=None, reserve=(1,))
    args = ((50, 8, 12), [], 4, (1,), (4, 8, 32), (4, 8, 32), (50, 8, 64), None, None, None)
    assert bwd(*args, **common, **rest, output_mask=[True, True, True, True]) == 2 * expected
    assert bwd(*args, **common, **rest, output_mask=[True, True, True, False]) == expected
    assert rnn_flops(12, 32, steps=10, mode="gru") == 3 * rnn_flops(12, 32, steps=10, mode="rnn")


class SelfAttention(nn.Module):
    """Scaled dot-product self-attention of the input with itself, times one learnable scale."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        q = x * self.scale
        return nn.functional.scaled_dot_product_attention(q, q, q)


def test_cpu_flash_attention_is_counted():
    b, h, s, d = 2, 3, 16, 8
    work = count_step(SelfAttention(), (torch.randn(b, h, s, d), torch.zeros(1)), loss_fn=square_loss)
    if "aten._scaled_dot_product_flash_attention_for_cpu" not in work.analytic:
        pytest.skip(f"this build ran another attention kernel: {sorted(work.flops_by_op)}")
    product = 2 * b * h * s * s * d  # one s×d by d×s (or s×s by s×d) product per head
    # forward: Q·Kᵀ and P·V; backward, as PyTorch's formula for the GPU kernels counts it: Q·Kᵀ recomputed, then
    # the gradients of P, V, Q and K (5 products)
    assert work.analytic == {"aten._scaled_dot_product_flash_attention_for_cpu": 2 * product,
                             "aten._scaled_dot_product_flash_attention_for_cpu_backward": 5 * product}
    assert work.flops == 7 * product


def test_count_step_leaves_the_model_untrained_and_returns_plain_data():
    model = nn.Linear(4, 3)
    before = [p.detach().clone() for p in model.parameters()]
    work = count_step(model, (torch.randn(8, 4), torch.randint(0, 3, (8,))), optimizer=torch.optim.Adam)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    data = json.loads(json.dumps(work.state_dict()))
    assert data["items"] == 8 and data["h2d_bytes"] == 0 and data["input_bytes"] == 8 * 4 * 4 + 8 * 8
    assert data["ops"] > data["kernels"] > 0 and data["bytes"] > 0
    assert counting.StepWork(**data) == work


@pytest.mark.parametrize("make", [lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
                                  lambda p: torch.optim.Adam(p, lr=1e-3, foreach=False)])
def test_count_step_steps_a_copy_of_the_optimizer_whatever_its_settings(make):
    """The optimizer is deep-copied with the model (helpers.step.train_step(copy=True)), never rebuilt from its
    settings (AdamW's defaults hold a key its constructor refuses); its state is cleared and yours is untouched.
    The step is counted: 2·4·2 forward + weight gradient, no input gradient."""
    model = nn.Linear(4, 2)
    optimizer = make(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()  # the learner's optimizer has state: it is neither copied nor touched
    state = optimizer.state
    held = {id(p): {k: v.clone() for k, v in s.items()} for p, s in state.items()}
    before = [p.detach().clone() for p in model.parameters()]
    work = count_step(model, (torch.randn(3, 4), torch.tensor([0, 1, 0])), optimizer=optimizer)
    assert work.flops == 2 * (2 * 3 * 4 * 2)
    assert optimizer.state is state and len(state) == 2
    assert all(torch.equal(held[id(p)][k], v) for p, s in state.items() for k, v in s.items())
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
