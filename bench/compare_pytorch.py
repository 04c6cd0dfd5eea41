#!/usr/bin/env python3
"""The reference models of kat_train (kat::nn::models: mlp, cnn, resnet) in PyTorch, trained
as kat_train trains them: Fashion-MNIST from the IDX files scaled to [0, 1], SGD with
momentum, a shuffled batch per step, softmax cross-entropy. Prints one CSV line per epoch:
epoch, training seconds (evaluation excluded), test accuracy. scripts/compare_pytorch.sh runs
it alternately with kat_train.

    compare_pytorch.py --data-dir DIR --model cnn --epochs 2 --train-subset 0 --threads 2
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
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
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x, y = load(a.data_dir, "train")
    if a.train_subset > 0:
        x, y = x[:a.train_subset], y[:a.train_subset]
    xt, yt = load(a.data_dir, "test")
    net = model(a.model)
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
    loss_fn = nn.CrossEntropyLoss()
    print("epoch,train_seconds,test_accuracy", flush=True)
    for epoch in range(1, a.epochs + 1):
        net.train()
        order = torch.randperm(len(x))
        t0 = time.perf_counter()
        for i in range(0, len(x), a.batch_size):
            idx = order[i:i + a.batch_size]
            opt.zero_grad(set_to_none=False)
            loss_fn(net(x[idx]), y[idx]).backward()
            opt.step()
        seconds = time.perf_counter() - t0
        net.eval()
        with torch.no_grad():
            correct = sum(int((net(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum())
                          for i in range(0, len(xt), 1000))
        print(f"{epoch},{seconds:.3f},{correct / len(xt):.4f}", flush=True)


if __name__ == "__main__":
    main()
