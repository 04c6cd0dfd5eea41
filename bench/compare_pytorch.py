#!/usr/bin/env python3
"""The reference models of kat_train (kat::nn::models: mlp, cnn, resnet, vit) in PyTorch, trained
as kat_train trains them: Fashion-MNIST from the IDX files scaled to [0, 1], SGD with
momentum (or Adam, or K-FAC + SGD), a shuffled batch per step, softmax cross-entropy. Prints
one CSV line per epoch: epoch, training seconds (evaluation excluded), test accuracy.
scripts/compare_pytorch.sh (CPU) and scripts/gpu_tests.sh compare (CUDA) run it alternately
with kat_train.

    compare_pytorch.py --data-dir DIR --model cnn --epochs 2 --train-subset 0 --threads 2
    compare_pytorch.py --data-dir DIR --model mlp --device cuda --optimizer kfac

`--precision bf16` runs the forward pass and the loss under
`torch.autocast(device, dtype=torch.bfloat16)` (bf16 matrix products and convolutions, fp32
parameters and optimizer state), PyTorch's own mixed precision, for kat_train --precision bf16
(scripts/compare_precision.sh).

On CUDA the whole data set is held on the GPU, matrix products and cuDNN run in strict FP32
(TF32 off), cuDNN's autotuner is on, and an epoch is timed between two synchronizations.

`--optimizer kfac` is K-FAC with KAISA's single-process algorithm and schedule (Pauloski et
al., SC'20; reference code gpauloski/kfac-pytorch, which is not installed here, so this file
carries its own): Kronecker factors of every Linear and Conv2d layer every
`--factor-update-steps` steps (running average, decay `--factor-decay`), eigendecompositions
every `--inv-update-steps` steps, the eigen-basis preconditioning with `--damping` and the KL
clip `--kl-clip` of ALGORITHMS.md section 1, then SGD with momentum. Factors and
decompositions in float32 (KAISA's defaults); compare with kat_train --optimizer kfac
--compute-method eigen --inverse-precision float.
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    def find(kind):
        for suffix in ("", ".gz"):
            path = os.path.join(data_dir, f"{prefix}-{kind}-idx{3 if kind == 'images' else 1}-ubyte{suffix}")
            if os.path.exists(path):
                return path
        raise FileNotFoundError(f"no {prefix} {kind} in {data_dir}")
    x = torch.from_numpy(read_idx(find("images")).astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(read_idx(find("labels")).astype(np.int64))
    return x, y


class Block(nn.Module):
    """He et al.'s basic block, as kat::nn::models::basic_block (projection option B)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.f = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.s = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, 0, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return self.f(x) + self.s(x)


class ViT(nn.Module):
    """kat::nn::models::vit with its defaults: 7x7 patches (16 tokens), width 64, 4 pre-norm
    blocks of 4 heads and MLP 128 (GELU), final LayerNorm, mean over the tokens."""

    def __init__(self, width=64, depth=4, heads=4, mlp=128, patch=7):
        super().__init__()
        self.embed = nn.Conv2d(1, width, patch, patch)
        self.pos = nn.Parameter(0.02 * torch.randn(1, (28 // patch) ** 2, width))
        block = nn.TransformerEncoderLayer(width, heads, mlp, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, depth)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        tokens = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.blocks(tokens)).mean(1))


def model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256),
                             nn.ReLU(), nn.Linear(256, 10))
    if name == "cnn":  # kat's order: max-pool before ReLU (equal results, a quarter of the work)
        return nn.Sequential(nn.Conv2d(1, 32, 5, 1, 2), nn.MaxPool2d(2), nn.ReLU(),
                             nn.Conv2d(32, 64, 5, 1, 2), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(),
                             nn.Linear(3136, 256), nn.ReLU(), nn.Linear(256, 10))
    if name == "resnet":
        layers = [nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
        cin = 16
        for stage in range(3):
            cout = 16 << stage
            for b in range(2):
                layers += [Block(cin, cout, 2 if stage > 0 and b == 0 else 1), nn.ReLU()]
                cin = cout
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
        return nn.Sequential(*layers)
    if name == "vit":
        return ViT()
    raise ValueError(f"--model must be mlp, cnn, resnet or vit, got {name!r}")


class KFAC:
    """K-FAC preconditioning of the gradients of `net`'s Linear and Conv2d layers, in place
    (K-FAC: Martens & Grosse 2015; conventions of ALGORITHMS.md section 1, which are KAISA's):

    A = aᵀa / M over the layer inputs a (M rows: samples, or samples x output positions for a
    convolution's im2col patches; a ones column where the layer has a bias), G = gᵀg / M over
    the output gradients with the loss's 1/N undone, running averages with decay, every
    `factor_update_steps` steps; A = Q_A diag(d_A) Q_Aᵀ, G likewise, every `inv_update_steps`
    steps; P = Q_G [(Q_Gᵀ ∇ Q_A) ⊘ (d_G d_Aᵀ + damping)] Q_Aᵀ, all P scaled by
    ν = min(1, sqrt(kl_clip / |Σ P ⊙ ∇ lr²|))."""

    def __init__(self, net, lr, factor_update_steps=10, inv_update_steps=100, damping=0.003,
                 factor_decay=0.95, kl_clip=0.001):
        self.layers = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
        self.lr, self.damping, self.decay, self.kl_clip = lr, damping, factor_decay, kl_clip
        self.factor_steps, self.inv_steps = factor_update_steps, inv_update_steps
        self.steps = 0
        self.a, self.g, self.A, self.G, self.eig = {}, {}, {}, {}, {}
        for m in self.layers:
            m.register_forward_pre_hook(self._save_input)
            m.register_full_backward_hook(self._save_output_grad)

    def _factor_step(self):
        return self.steps % self.factor_steps == 0

    def _save_input(self, m, inputs):
        if m.training and torch.is_grad_enabled() and self._factor_step():
            self.a[m] = inputs[0].detach()

    def _save_output_grad(self, m, grad_inputs, grad_outputs):
        if self._factor_step():
            self.g[m] = grad_outputs[0].detach()

    def _factors(self, m):
        a, g = self.a.pop(m), self.g.pop(m)
        n = a.shape[0]
        if isinstance(m, nn.Conv2d):
            a = F.unfold(a, m.kernel_size, m.dilation, m.padding, m.stride).transpose(1, 2)
            a = a.reshape(-1, a.shape[-1])
            g = g.permute(0, 2, 3, 1).reshape(-1, g.shape[1])
        if m.bias is not None:
            a = torch.cat([a, a.new_ones(a.shape[0], 1)], 1)
        rows = a.shape[0]
        g = g * n  # undo the mean's 1/N
        return a.t() @ a / rows, g.t() @ g / rows

    @staticmethod
    def _eigh(f):
        # On the CPU in float64: LAPACK's ssyevd returns its workspace size as a float, which
        # can round below the size needed from about n = 2,900 on (CNN's 3137 x 3137 A; Debian's
        # PyTorch 1.13 then fails with "SSYEVD parameter number 8 had an illegal value").
        if f.device.type == "cpu":
            d, q = torch.linalg.eigh(f.double())
            return d.to(f.dtype), q.to(f.dtype)
        return torch.linalg.eigh(f)

    def step(self):
        if self._factor_step():
            for m in self.layers:
                A, G = self._factors(m)
                for store, new in ((self.A, A), (self.G, G)):
                    new = (new + new.t()) / 2
                    store[m] = new if m not in store else self.decay * store[m] + (1 - self.decay) * new
        if self.steps % self.inv_steps == 0:
            for m in self.layers:
                dA, QA = self._eigh(self.A[m])
                dG, QG = self._eigh(self.G[m])
                self.eig[m] = (dA.clamp(min=0), QA, dG.clamp(min=0), QG)
        precond, vg = [], 0.0
        for m in self.layers:
            dA, QA, dG, QG = self.eig[m]
            grad = m.weight.grad.reshape(m.weight.shape[0], -1)
            if m.bias is not None:
                grad = torch.cat([grad, m.bias.grad.reshape(-1, 1)], 1)
            v = QG.t() @ grad @ QA
            p = QG @ (v / (dG[:, None] * dA[None, :] + self.damping)) @ QA.t()
            precond.append((m, p))
            vg = vg + (p * grad).sum() * self.lr ** 2
        nu = torch.clamp(torch.sqrt(self.kl_clip / vg.abs()), max=1.0)
        for m, p in precond:
            p = p * nu
            if m.bias is not None:
                m.bias.grad.copy_(p[:, -1])
                p = p[:, :-1]
            m.weight.grad.copy_(p.reshape(m.weight.shape))
        self.steps += 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--model", default="mlp")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--train-subset", type=int, default=0, help="first N images only (0: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "kfac"],
                   help="sgd (with --momentum), adam (default betas and eps), kfac (K-FAC + sgd)")
    p.add_argument("--factor-update-steps", type=int, default=10)
    p.add_argument("--inv-update-steps", type=int, default=100)
    p.add_argument("--damping", type=float, default=0.003)
    p.add_argument("--factor-decay", type=float, default=0.95)
    p.add_argument("--kl-clip", type=float, default=0.001)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: forward and loss under torch.autocast(device, torch.bfloat16)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    x, y = load(a.data_dir, "train")
    if a.train_subset > 0:
        x, y = x[:a.train_subset], y[:a.train_subset]
    xt, yt = load(a.data_dir, "test")
    x, y, xt, yt = x.to(dev), y.to(dev), xt.to(dev), yt.to(dev)
    net = model(a.model).to(dev)
    if a.optimizer == "adam":
        opt = torch.optim.Adam(net.parameters(), lr=a.lr)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
    kfac = None
    if a.optimizer == "kfac":
        kfac = KFAC(net, a.lr, a.factor_update_steps, a.inv_update_steps, a.damping,
                    a.factor_decay, a.kl_clip)
    loss_fn = nn.CrossEntropyLoss()
    print("epoch,train_seconds,test_accuracy", flush=True)
    for epoch in range(1, a.epochs + 1):
        net.train()
        order = torch.randperm(len(x), device=dev)
        sync()
        t0 = time.perf_counter()
        for i in range(0, len(x), a.batch_size):
            idx = order[i:i + a.batch_size]
            opt.zero_grad(set_to_none=False)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                loss = loss_fn(net(x[idx]), y[idx])
            loss.backward()
            if kfac is not None:
                kfac.step()
            opt.step()
        sync()
        seconds = time.perf_counter() - t0
        net.eval()
        # Under autocast, PyTorch 1.13's fused TransformerEncoderLayer inference path (taken in
        # eval mode without gradients) fails on bf16 ("expected scalar type BFloat16 but found
        # Float"); with gradients enabled it takes the ordinary path. Evaluation is not timed.
        bf16 = a.precision == "bf16"
        with torch.set_grad_enabled(bf16), torch.autocast(dev.type, dtype=torch.bfloat16,
                                                          enabled=bf16):
            correct = sum(int((net(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum())
                          for i in range(0, len(xt), 1000))
        print(f"{epoch},{seconds:.3f},{correct / len(xt):.4f}", flush=True)


if __name__ == "__main__":
    main()
