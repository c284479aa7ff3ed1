"""The speed-of-light model checked on this machine: each course workload's FLOPs counted by
helpers.counting.count_step against an analytic count, its step time predicted from this machine's measured
ceilings (helpers.ceilings, helpers.predictions) against the measured one, and the same counts predicted on
datasheet GPUs.

Analytic counts are independent of PyTorch's counter: per layer, from the shapes a forward hook sees — a
convolution 2·(C_in/groups)·k_h·k_w·C_out per output position, a linear layer 2·in·out per row, an LSTM
helpers.counting.rnn_flops over the packed positions — times three for a training step (forward, the gradient
of the input, the gradient of the weights), less the input gradient of the first layer (its input needs none;
for an LSTM only the input projection's share, I / (I + H): the recurrence still needs the gradient of h).
Sizes: the CPU sizes of notebooks 01, 05 and 08. Runs on the GPU when there is one (CUDA; `--device cpu` to
choose), so a GPU node checks the model against its own measured ceilings too. Prints one table; --json adds it.
"""
import json
import sys

import torch
from torch import nn

from helpers.devices import describe
from helpers.labels import LabelEncoder
from helpers.models import CompactNet, ConvBlockNet, SequenceClassifier
from helpers.ceilings import measured_ceilings
from helpers.predictions import check_predictions
from helpers.counting import rnn_flops
from helpers.vowels import SequenceDataset, load_japanese_vowels, pad_collate


def layer_flops(module: nn.Module, x, out) -> tuple[int, int]:
    """(forward FLOPs, the part of them whose input gradient the first layer skips) of one layer's call."""
    if isinstance(module, nn.Conv2d):
        per = 2 * module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
        return per * out.numel(), per * out.numel()
    if isinstance(module, nn.Linear):
        f = 2 * module.in_features * out.numel()
        return f, f
    steps = int(x.batch_sizes.sum()) if hasattr(x, "batch_sizes") else x.shape[0] * x.shape[1]
    total = rnn_flops(module.input_size, module.hidden_size, steps=steps, num_layers=module.num_layers,
                      bidirectional=module.bidirectional)
    first = rnn_flops(module.input_size, module.hidden_size, steps=steps, bidirectional=module.bidirectional)
    return total, first * module.input_size // (module.input_size + module.hidden_size)


def analytic_training_flops(model: nn.Module, inputs: tuple) -> int:
    """Forward FLOPs of the layers a hook sees, times three, less the first layer's input gradient."""
    seen = []
    handles = [m.register_forward_hook(lambda m, args, out: seen.append(layer_flops(m, args[0], out)))
               for m in model.modules()
               if isinstance(m, (nn.Conv2d, nn.Linear, nn.LSTM)) and any(p.requires_grad for p in m.parameters())]
    with torch.no_grad():
        model(*inputs)
    for h in handles:
        h.remove()
    return 3 * sum(f for f, _ in seen) - seen[0][1]


def main(argv) -> int:
    vx, vy = load_japanese_vowels("train")
    vowels = SequenceDataset(vx, LabelEncoder.fit(vy).encode(vy))
    lstm_batch = pad_collate([vowels[i] for i in range(27)])
    conv_batch = (torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,)))
    lstm = SequenceClassifier(12, 9, hidden=100, bidirectional=True)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    vectors = [torch.randn(2**25) for _ in range(3)]
    cases = {"BiLSTM, batch 27 (01)": dict(model=lstm, batch=lstm_batch, host_inputs=(1,), optimizer=torch.optim.Adam),
             "ConvBlockNet, batch 128 (05, 08)": dict(model=ConvBlockNet(), batch=conv_batch),
             "CompactNet, batch 128 (05, 08)": dict(model=CompactNet(), batch=conv_batch),
             "matmul 2048 (08)": dict(fn=torch.mm, args=(a, b)),
             "elementwise add 2^25 (08)": dict(fn=lambda x, y, z: torch.add(x, y, out=z), args=vectors)}
    analytic = {"BiLSTM, batch 27 (01)": analytic_training_flops(lstm, lstm_batch[:2]),
                "ConvBlockNet, batch 128 (05, 08)": analytic_training_flops(ConvBlockNet(), conv_batch[:1]),
                "CompactNet, batch 128 (05, 08)": analytic_training_flops(CompactNet(), conv_batch[:1]),
                "matmul 2048 (08)": 2 * 2048**3, "elementwise add 2^25 (08)": 0}
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cuda" if torch.cuda.is_available() else "cpu"
    ceilings = measured_ceilings(device)
    rows = check_predictions(cases, device, ceilings=ceilings, min_run_time=1.0)
    where = describe()["gpus"][0]["name"] if device.startswith("cuda") else describe()["cpu"]
    print(f"device: {device} ({where}), torch {torch.__version__}, {torch.get_num_threads()} threads; ceilings "
          f"{ceilings['flops_per_s']['float32'] / 1e9:.0f} GFLOP/s fp32, {ceilings['bytes_per_s'] / 1e9:.1f} GB/s, "
          f"{ceilings['op_s'] * 1e6:.2f} us per operator (measured {ceilings['measured_at']}, load "
          f"{ceilings['load_average']})")
    print("| workload | counted GFLOP | analytic GFLOP | predicted ms | measured ms | measured / predicted | bound |"
          " T4 / A100 / H100 predicted ms |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        gpus = " / ".join(f"{g['step_s'] * 1e3:.3g}" if "step_s" in g else "-" for g in r["gpus"].values())
        print(f"| {name} | {r['flops'] / 1e9:.3f} | {analytic[name] / 1e9:.3f} | {r['predicted_s'] * 1e3:.2f} | "
              f"{r['measured_s'] * 1e3:.2f} | {r['ratio']:.2f} | {r['bound']} | {gpus} |")
        rows[name]["analytic_flops"] = analytic[name]
    if "--json" in argv:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
