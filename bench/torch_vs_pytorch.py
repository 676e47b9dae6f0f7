#!/usr/bin/python3
"""PyTorch's own DistributedDataParallel (Python, gloo, one process per rank) on the CNN of
examples/torch_fashion_mnist, with the same hyper-parameters: the baseline bench/torch_vs_pytorch.sh
runs beside ddp::torch. Prints one line: samples/s of training and the test accuracy.

  /usr/bin/python3 bench/torch_vs_pytorch.py --ranks 2 --epochs 1 --batch 64 --lr 0.1
"""
import argparse
import gzip
import math
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class CNN(nn.Module):  # examples/torch_fashion_mnist/torch_platform.hpp, layer for layer
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x.view(-1, 1, 28, 28)))), 2)
        h = F.max_pool2d(F.relu(self.bn2(self.conv2(h))), 2)
        return self.fc2(self.dropout(F.relu(self.fc1(h.flatten(1)))))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(directory, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz")).astype(np.float32)
    y = read_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64)
    x = (x.reshape(len(x), 784) / 255.0 - 0.2860) / 0.3530  # ddp::data::fashion_mnist::collate
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)


def rank_main(rank, args, result):
    torch.set_num_threads(1)  # as ddp: the ranks are the parallelism
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.ranks)
    torch.manual_seed(args.seed)
    model = nn.parallel.DistributedDataParallel(CNN())
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    x, y = load(args.data_dir, "train")
    sampler = torch.utils.data.distributed.DistributedSampler(torch.utils.data.TensorDataset(x, y), seed=args.seed)
    steps_per_epoch = math.ceil(len(sampler) / args.batch)
    total = steps_per_epoch * args.epochs
    step = 0
    train_seconds = 0.0
    samples = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        indices = torch.tensor(list(iter(sampler)))
        dist.barrier()
        start = time.perf_counter()
        model.train()
        for b in range(steps_per_epoch):
            idx = indices[b * args.batch:(b + 1) * args.batch]
            for group in opt.param_groups:  # the example's cosine schedule
                group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / total))
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            step += 1
            samples += len(idx) * args.ranks
        dist.barrier()
        train_seconds += time.perf_counter() - start
    tx, ty = load(args.data_dir, "test")
    model.eval()
    with torch.no_grad():
        correct = torch.tensor([(model(tx[rank::args.ranks]).argmax(1) == ty[rank::args.ranks]).sum().item()])
    dist.all_reduce(correct)
    if rank == 0:
        result["samples_per_second"] = samples / train_seconds
        result["accuracy"] = correct.item() / len(ty)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    with mp.Manager() as manager:
        result = manager.dict()
        mp.spawn(rank_main, args=(args, result), nprocs=args.ranks)
        print(f"pytorch-ddp samples/s {result['samples_per_second']:.0f} test accuracy {100 * result['accuracy']:.2f}%")


if __name__ == "__main__":
    main()
