"""The evidence's tasks -- data, model, hyperparameters -- shared by the
simulator runs and the MPI training program, so both train the same thing.

fashion (the main task): Fashion-MNIST from Debian's ``dataset-fashion-mnist``
package (``/usr/share/datasets/fashion-mnist/``, no download), 28x28 images
averaged down to 14x14; a fixed subset of the 60,000 training images for
training, a disjoint fixed validation split carved from the same 60,000, and
the full 10,000-image test set.

digits (the quick task): scikit-learn's 1,797 real 8x8 handwritten digits (in
the wheel), split once into training, validation and test sets.

Every split is drawn once from a generator seeded with 0, so every run, rank
and machine sees the same images.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

Dataset = Tuple[torch.Tensor, torch.Tensor]
Splits = Tuple[Dataset, Dataset, Dataset]  # training, validation, test

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


class FashionCNN(nn.Module):
    """A small CNN on 14x14 images: two 3x3 convolutions (16 and 32
    channels), each followed by ReLU and 2x2 max-pooling, and a linear layer
    (7,690 parameters; no BatchNorm: the simulator and the server then hold
    the whole model state)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 3 * 3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class DigitsNet(nn.Module):
    """Two 3x3 convolutions and a linear layer on 8x8 images."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def read_idx(path: Path) -> np.ndarray:
    """An idx file (the MNIST format: magic, dimensions, unsigned bytes), gzipped."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:2] != b"\0\0" or data[2] != 0x08:
        raise ValueError(f"{path}: not an idx file of unsigned bytes")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(data[3])]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def load_fashion_data(train_size: int = 12000, validation_size: int = 5000) -> Splits:
    """Fashion-MNIST as (N, 1, 14, 14) floats in [0, 1]: ``train_size`` and
    ``validation_size`` disjoint images of the training set, and the test set."""
    files = {name: FASHION_MNIST / f"{name}-ubyte.gz"
             for name in ("train-images-idx3", "train-labels-idx1", "t10k-images-idx3", "t10k-labels-idx1")}
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"Fashion-MNIST is not installed ({missing[0]} is missing): install Debian's "
                                "package with `apt-get install dataset-fashion-mnist` (.ci/setup.sh does)")

    def images(name: str) -> torch.Tensor:
        x = torch.tensor(read_idx(files[name]), dtype=torch.float32).unsqueeze(1) / 255.0
        return F.avg_pool2d(x, 2)

    def labels(name: str) -> torch.Tensor:
        return torch.tensor(read_idx(files[name]), dtype=torch.long)

    x, y = images("train-images-idx3"), labels("train-labels-idx1")
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    validation, train = order[:validation_size], order[validation_size : validation_size + train_size]
    test = (images("t10k-images-idx3"), labels("t10k-labels-idx1"))
    return (x[train], y[train]), (x[validation], y[validation]), test


def load_digits_data() -> Splits:
    """Digits as (N, 1, 8, 8) floats in [0, 1]: a fixed 20% test set, 20% of
    the rest for validation."""
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    n_test = len(y) // 5
    n_validation = (len(y) - n_test) // 5
    test, validation, train = order[:n_test], order[n_test : n_test + n_validation], order[n_test + n_validation :]
    return (x[train], y[train]), (x[validation], y[validation]), (x[test], y[test])


@dataclass(frozen=True)
class Task:
    """A data set, a model, and what every method shares: the epochs, the
    batch per worker and the rate's schedule (the rate itself is tuned per
    method: ``benchmarks/evidence/plan.py``)."""

    name: str
    model: Callable[[], nn.Module]
    load: Callable[[], Splits]
    epochs: int
    batch_size: int
    sizes: Tuple[int, int, int]  # training, validation and test examples, checked on loading

    def data(self, cache: Path) -> Splits:
        """The splits, prepared once and kept in ``cache`` (every MPI rank then
        loads one small file), checked against ``sizes``."""
        path = Path(cache) / f"{self.name}.pt"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            torch.save(self.load(), partial)
            partial.replace(path)
        splits = torch.load(path, weights_only=True)
        found = tuple(len(labels) for _, labels in splits)
        if found != self.sizes:
            raise ValueError(f"{path}: {found} training, validation and test examples, not {self.sizes}")
        return splits


def rate_at(lr: float, epoch: float, epochs: int, scale: float = 1.0, warmup: float = 0.0,
            workers: int = 1) -> float:
    """The rate at (fractional) epoch ``epoch`` of ``epochs``: ``lr * scale``,
    divided by 10 at 50% and 75% of the epochs; during the first ``warmup``
    epochs it rises linearly from 1/``workers`` of that to all of it (the
    gradual warm-up of Goyal et al., 2017: from the one-worker rate to the
    rate of the average of ``workers`` gradients)."""
    factor = scale
    if warmup and epoch < warmup:
        factor *= 1.0 / workers + (1.0 - 1.0 / workers) * epoch / warmup
    return lr * factor * (0.1 ** ((epoch >= epochs / 2) + (epoch >= 3 * epochs / 4)))


TASKS: Dict[str, Task] = {
    # the epochs and the sizes are docs/results/PLAN.md's
    "fashion": Task("fashion", FashionCNN, load_fashion_data, epochs=4, batch_size=32, sizes=(12000, 5000, 10000)),
    "digits": Task("digits", DigitsNet, load_digits_data, epochs=4, batch_size=16, sizes=(1151, 287, 359)),
}
