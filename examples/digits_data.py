"""scikit-learn's digits (1,797 real 8x8 handwritten digits, shipped inside
scikit-learn: nothing is downloaded) as the MNIST stand-in of the Horovod-form
examples beside this file."""

import torch
import torch.utils.data
from sklearn.datasets import load_digits


def digits(train):
    """scikit-learn's digits as (1, 8, 8) images; the same 80/20 split everywhere."""
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    y = torch.tensor(labels)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    split = order[len(y) // 5 :] if train else order[: len(y) // 5]
    return torch.utils.data.TensorDataset(x[split], y[split])
