"""Horovod's elastic PyTorch MNIST example, on scikit-learn's digits.

``pytorch_digits_elastic_horovod.py`` is elastic Horovod (its ring formed
again as workers come and go; it needs Horovod built with Gloo and its
elastic launcher); ``pytorch_digits_elastic.py`` is the same script with
only its import changed, to train asynchronously with DC-ASGD on a parameter
server (one more rank than workers), where no worker's arrival or departure
interrupts the others (docs/USAGE.md, "hvd.elastic"):

    horovodrun -np 2 --min-np 1 --host-discovery-script ./hosts.sh python examples/pytorch_digits_elastic_horovod.py
    mpirun -np 3 python examples/pytorch_digits_elastic.py       # server + 2 workers

The data set (1,797 real 8x8 handwritten digits) ships inside scikit-learn,
so nothing is downloaded.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import horovod.torch as hvd

from digits_data import digits  # scikit-learn's digits, this folder's stand-in for MNIST

# Training settings
parser = argparse.ArgumentParser(description="PyTorch digits elastic example")
parser.add_argument("--batch-size", type=int, default=16, metavar="N", help="input batch size for training (default: 16)")
parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N", help="input batch size for testing (default: 1000)")
parser.add_argument("--epochs", type=int, default=10, metavar="N", help="number of epochs to train (default: 10)")
parser.add_argument("--lr", type=float, default=0.05, metavar="LR", help="learning rate (default: 0.05)")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M", help="SGD momentum (default: 0.5)")
parser.add_argument("--seed", type=int, default=42, metavar="S", help="random seed (default: 42)")
parser.add_argument("--log-interval", type=int, default=10, metavar="N", help="how many batches to wait before logging training status")
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="use fp16 compression during allreduce")
args = parser.parse_args()

# Horovod: initialize library.
hvd.init()
torch.manual_seed(args.seed)

# Horovod: limit # of CPU threads to be used per worker.
torch.set_num_threads(1)


train_dataset = digits(train=True)
# Horovod: use DistributedSampler to partition the training data.
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_dataset, num_replicas=hvd.size(), rank=hvd.rank(), seed=args.seed)
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)

test_dataset = digits(train=False)
# Horovod: use DistributedSampler to partition the test data.
test_sampler = torch.utils.data.distributed.DistributedSampler(
    test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(128, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = x.view(-1, 128)
        x = F.relu(self.fc1(x))
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


model = Net()

# Horovod: scale learning rate by the number of workers.
optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)

# Horovod: (optional) compression algorithm.
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none


@hvd.elastic.run
def train(state):
    # post synchronization event (worker added, worker removed) init ...
    for state.epoch in range(state.epoch, args.epochs + 1):
        state.model.train()

        train_sampler.set_epoch(state.epoch)
        steps_remaining = len(train_loader) - state.batch

        for state.batch, (data, target) in enumerate(train_loader):
            if state.batch >= steps_remaining:
                break

            state.optimizer.zero_grad()
            output = state.model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            state.optimizer.step()
            if state.batch % args.log_interval == 0 and hvd.rank() == 0:
                print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                    state.epoch, state.batch * len(data), len(train_sampler),
                    100.0 * state.batch / len(train_loader), loss.item()), flush=True)
            state.commit()
        state.batch = 0


def test():
    model.eval()
    test_loss = 0.
    test_accuracy = 0.
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            # sum up batch loss
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            # get the index of the max log-probability
            pred = output.data.max(1, keepdim=True)[1]
            test_accuracy += pred.eq(target.data.view_as(pred)).cpu().float().sum().item()

    # Horovod: use test_sampler to determine the number of examples in
    # this worker's partition.
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)

    # Horovod: average metric values across workers.
    test_loss = hvd.allreduce(torch.tensor(test_loss), name="avg_loss").item()
    test_accuracy = hvd.allreduce(torch.tensor(test_accuracy), name="avg_accuracy").item()

    # Horovod: print output only on first rank.
    if hvd.rank() == 0:
        print("Test set: Average loss: {:.4f}, Accuracy: {:.2f}%".format(test_loss, 100. * test_accuracy), flush=True)


# Horovod: wrap optimizer with DistributedOptimizer.
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), compression=compression)


# adjust learning rate on reset
def on_state_reset():
    for param_group in optimizer.param_groups:
        param_group["lr"] = args.lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
state.register_reset_callbacks([on_state_reset])
train(state)
test()
