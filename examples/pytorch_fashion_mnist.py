"""A CNN on Fashion-MNIST, written the way a Horovod script is, trained
asynchronously with DC-ASGD on a parameter server (one more rank than workers):

    mpirun -np 5 python examples/pytorch_fashion_mnist.py                 # server + 4 workers
    hvd-dcasgd-run -n 4 examples/pytorch_fashion_mnist.py --epochs 5
    sbatch slurm/one_node.sbatch examples/pytorch_fashion_mnist.py        # preemptible, resumes by itself

What a Horovod user keeps: a DataLoader with a DistributedSampler, the rate
scaled by hvd.size(), ``metric_average`` over the workers, logging and a
TensorBoard SummaryWriter (loss, accuracy) on worker 0 only.  What is ours:
the import, and the server writes the checkpoints (``--checkpoint-dir``, or
``HVD_DCASGD_CHECKPOINT_DIR``, which the SLURM scripts set): a job that is
stopped (SIGTERM, SLURM's preemption) or killed, run again with the same
folder, resumes where the server's checkpoint left it -- the script skips the
``optimizer.pushes`` steps already taken.  With ``HVD_DCASGD_METRICS`` the
server's own scalars (staleness, each worker's rate) join the same
TensorBoard folder.

The data is Debian's ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``,
``--data`` elsewhere): 60,000 training and 10,000 test images, 28x28.
"""

import argparse
import gzip
import logging
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import hvd_dcasgd as hvd

parser = argparse.ArgumentParser(description="PyTorch Fashion-MNIST example")
parser.add_argument("--batch-size", type=int, default=64, metavar="N", help="input batch size for training (default: 64)")
parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N", help="input batch size for testing (default: 1000)")
parser.add_argument("--epochs", type=int, default=3, metavar="N", help="number of epochs to train (default: 3)")
parser.add_argument("--lr", type=float, default=0.01, metavar="LR", help="learning rate of one worker (default: 0.01)")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M", help="SGD momentum (default: 0.5)")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
parser.add_argument("--seed", type=int, default=42, metavar="S", help="random seed (default: 42)")
parser.add_argument("--log-interval", type=int, default=100, metavar="N", help="batches between two log lines")
parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="folder of the four idx .gz files")
parser.add_argument("--train-size", type=int, default=None, metavar="N", help="use the first N training images only")
parser.add_argument("--test-size", type=int, default=None, metavar="N", help="use the first N test images only")
parser.add_argument("--log-dir", default=None, help="TensorBoard folder: worker 0's loss and accuracy, the server's scalars")
parser.add_argument("--checkpoint-dir", default=None, help="the server's checkpoints (resume from the newest)")

log = logging.getLogger("fashion_mnist")


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.conv2_drop = nn.Dropout2d(0.25)
        self.fc1 = nn.Linear(64 * 5 * 5, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, p=0.25, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def read_idx(path):
    """An idx file (magic, dimensions, unsigned bytes), gzipped, as a numpy array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    if data[:3] != b"\0\0\x08":
        raise ValueError(f"{path}: not an idx file of unsigned bytes")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(data[3])]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def fashion_mnist(folder, train, size=None):
    """Fashion-MNIST as a TensorDataset of (1, 28, 28) images normalised as Horovod's MNIST example does."""
    kind = "train" if train else "t10k"
    images = read_idx(os.path.join(folder, f"{kind}-images-idx3-ubyte.gz"))[:size]
    labels = read_idx(os.path.join(folder, f"{kind}-labels-idx1-ubyte.gz"))[:size]
    x = (torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 255.0 - 0.2860) / 0.3530
    return torch.utils.data.TensorDataset(x, torch.tensor(labels, dtype=torch.long))


def summary_writer(log_dir):
    """A TensorBoard SummaryWriter, or None (no folder asked for, or no tensorboard package)."""
    if not log_dir:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        log.warning("tensorboard is not installed (pip install tensorboard): no event files in %s", log_dir)
        return None
    return SummaryWriter(os.path.join(log_dir, "worker0"))


def train(args):
    def metric_average(val, name):
        tensor = torch.tensor(val)
        avg_tensor = hvd.allreduce(tensor, name=name)
        return avg_tensor.item()

    def train_epoch(epoch, skip):
        model.train()
        # Horovod: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            if batch_idx < skip:  # taken by the job this one resumes
                continue
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                # Horovod: use train_sampler to determine the number of examples in this worker's partition.
                log.info("Train Epoch: %d [%d/%d (%.0f%%)]\tLoss: %.6f", epoch, batch_idx * len(data),
                         len(train_sampler), 100.0 * batch_idx / len(train_loader), loss.item())
                if writer:
                    writer.add_scalar("train/loss", loss.item(), optimizer.pushes)

    def test(epoch):
        model.eval()
        test_loss, test_accuracy = 0.0, 0.0
        with torch.no_grad():
            for data, target in test_loader:
                if args.cuda:
                    data, target = data.cuda(), target.cuda()
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                pred = output.argmax(1, keepdim=True)
                test_accuracy += pred.eq(target.view_as(pred)).float().sum().item()
        # Horovod: use test_sampler to determine the number of examples in this worker's partition.
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)
        # Horovod: average metric values across workers.
        test_loss = metric_average(test_loss, "avg_loss")
        test_accuracy = metric_average(test_accuracy, "avg_accuracy")
        # Horovod: log only on the first rank.
        if hvd.rank() == 0:
            log.info("Test set (epoch %d): Average loss: %.4f, Accuracy: %.2f%%", epoch, test_loss,
                     100.0 * test_accuracy)
            if writer:
                writer.add_scalar("test/loss", test_loss, epoch)
                writer.add_scalar("test/accuracy", test_accuracy, epoch)
                writer.flush()
        return test_accuracy

    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(args.seed)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if args.cuda:
        # Horovod: pin GPU to local rank.
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    train_dataset = fashion_mnist(args.data, train=True, size=args.train_size)
    # Horovod: use DistributedSampler to partition the training data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)

    test_dataset = fashion_mnist(args.data, train=False, size=args.test_size)
    # Horovod: use DistributedSampler to partition the test data.
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net()
    if args.cuda:
        model.cuda()

    # Horovod: scale learning rate by the number of workers.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: wrap optimizer with DistributedOptimizer.  The server (one
    # more rank) serves here until the workers are done; with checkpoint_dir
    # it writes checkpoints and a rerun resumes from the newest; with
    # metrics_dir its own scalars go beside worker 0's.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         checkpoint_dir=args.checkpoint_dir, metrics_dir=args.log_dir)

    # Resumed: skip the steps the server has already taken (0 on a fresh start).
    # Resumed with another number of workers, every worker gets the even share
    # of all the steps taken before, so the re-split DistributedSampler shards
    # go on at the same place of the epoch (docs/RELIABILITY.md).
    start_epoch, skip = divmod(optimizer.pushes, len(train_loader))
    writer = summary_writer(args.log_dir) if hvd.rank() == 0 else None
    if optimizer.pushes and hvd.rank() == 0:
        log.info("Resumed at epoch %d, batch %d (%d steps taken)", start_epoch + 1, skip, optimizer.pushes)

    accuracy = 0.0
    for epoch in range(start_epoch + 1, args.epochs + 1):
        train_epoch(epoch, skip if epoch == start_epoch + 1 else 0)
        accuracy = test(epoch)

    hvd.shutdown()  # every rank now holds the server's final weights
    if hvd.rank() == 0:
        log.info("final test accuracy %.4f (%s, %d workers)", accuracy, optimizer.method, hvd.size())
        if writer:
            writer.close()


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    train(args)
