"""Train a small CNN on scikit-learn's digits with asynchronous DC-ASGD.

Written the Horovod way; only the import and the optimizer line are ours.

    mpirun -np 5 python examples/train_digits.py                 # server + 4 workers
    HVD_DCASGD_COMPENSATION=none mpirun -np 5 python examples/train_digits.py
    python examples/train_digits.py                              # one process: local SGD

The data set (1,797 real 8x8 handwritten digits) ships inside scikit-learn.
"""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

import hvd_dcasgd as hvd


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 2 * 2, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def load_data(seed: int, test_fraction: float = 0.2):
    """Digits as (N, 1, 8, 8) float tensors, split the same way on every rank."""
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        correct = (model(x).argmax(1) == y).float().mean()
    model.train()
    return correct.item()


def constants(optimizer) -> str:
    """The compensation's constants, as the server applies them (none for ASGD, sync or Horovod)."""
    settings = getattr(optimizer, "compensation", None)
    found = settings.constants() if settings is not None else {}
    return "".join(f", {name} {value:g}" for name, value in found.items())


def main():
    parser = argparse.ArgumentParser(description="DC-ASGD on scikit-learn digits")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--compensation", default="adaptive", choices=hvd.MODES)
    parser.add_argument("--lambda-0", type=float, default=None, help="DC-ASGD's lambda_0 (default: the method's)")
    parser.add_argument("--bound", type=float, default=None,
                        help="DC-ASGD's bound on its correction, times |g| (default 1; inf: the paper's rule)")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--trace", default=None, help="write the server's staleness trace here")
    parser.add_argument("--save", default=None, help="save the final model here (worker 0)")
    parser.add_argument("--straggler", type=float, default=1.0, metavar="FACTOR",
                        help="make the last worker slow: it sleeps after each step's compute so that the step "
                             "takes FACTOR times as long")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    (x_train, y_train), (x_test, y_test) = load_data(args.seed)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none,
        compensation=args.compensation,
        lambda_0=args.lambda_0,
        bound=args.bound,
        model=model,
        trace=args.trace,
        lr_scaling="none",  # --lr is the rate for every gradient, as sequential SGD's (the paper's setting)
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    shard = torch.arange(hvd.rank(), len(y_train), hvd.size())
    generator = torch.Generator().manual_seed(args.seed + hvd.rank())
    slow = args.straggler > 1.0 and hvd.rank() == hvd.size() - 1
    started, slept = time.perf_counter(), 0.0
    for epoch in range(args.epochs):
        order = shard[torch.randperm(len(shard), generator=generator)]
        for start in range(0, len(order), args.batch_size):
            batch = order[start : start + args.batch_size]
            computing = time.perf_counter()
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_train[batch]), y_train[batch])
            loss.backward()
            if slow:
                pause = (args.straggler - 1.0) * (time.perf_counter() - computing)
                time.sleep(pause)
                slept += pause
            optimizer.step()
        test_accuracy = hvd.allreduce(torch.tensor(accuracy(model, x_test, y_test)), name="accuracy").item()
        if hvd.rank() == 0 and (epoch + 1) % 10 == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}, mean worker test accuracy {test_accuracy:.4f}", flush=True)

    hvd.shutdown()  # every rank now holds the server's final weights
    if slow:
        print(f"worker {hvd.rank()} (the straggler) slept {slept:.2f} s", flush=True)
    if hvd.rank() == 0:
        print(
            f"final test accuracy {accuracy(model, x_test, y_test):.4f} "
            f"(compensation {optimizer.method}{constants(optimizer)}, {hvd.size()} workers, "
            f"{time.perf_counter() - started:.1f} s)",
            flush=True,
        )
        if args.save:
            torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
