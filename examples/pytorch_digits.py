"""Horovod's PyTorch MNIST example, on scikit-learn's digits.

``pytorch_digits_horovod.py`` is plain Horovod; ``pytorch_digits.py`` is the
same script with only its import changed, to train asynchronously with
DC-ASGD on a parameter server (one more rank than workers):

    horovodrun -np 4 python examples/pytorch_digits_horovod.py   # Horovod, 4 workers
    horovodrun -np 5 python examples/pytorch_digits.py           # server + 4 workers
    mpirun -np 5 python examples/pytorch_digits.py               # the same with mpirun

The data set (1,797 real 8x8 handwritten digits) ships inside scikit-learn,
so nothing is downloaded.  Worker 0 logs, and saves a checkpoint after every
epoch; a rerun resumes from the newest one.
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import hvd_dcasgd as hvd

from digits_data import digits  # scikit-learn's digits, this folder's stand-in for MNIST

# Training settings
parser = argparse.ArgumentParser(description="PyTorch digits example")
parser.add_argument("--batch-size", type=int, default=16, metavar="N", help="input batch size for training (default: 16)")
parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N", help="input batch size for testing (default: 1000)")
parser.add_argument("--epochs", type=int, default=10, metavar="N", help="number of epochs to train (default: 10)")
parser.add_argument("--lr", type=float, default=0.05, metavar="LR", help="learning rate (default: 0.05)")
parser.add_argument("--momentum", type=float, default=0.5, metavar="M", help="SGD momentum (default: 0.5)")
parser.add_argument("--no-cuda", action="store_true", default=False, help="disables CUDA training")
parser.add_argument("--seed", type=int, default=42, metavar="S", help="random seed (default: 42)")
parser.add_argument("--log-interval", type=int, default=10, metavar="N", help="how many batches to wait before logging training status")
parser.add_argument("--fp16-allreduce", action="store_true", default=False, help="use fp16 compression during allreduce")
parser.add_argument("--use-adasum", action="store_true", default=False, help="use adasum algorithm to do reduction")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0, help="apply gradient predivide factor in optimizer (default: 1.0)")
parser.add_argument("--checkpoint-format", default=None, help="checkpoint file format, e.g. ./checkpoint-{epoch}.pth.tar (default: no checkpoints)")


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.conv2_drop = nn.Dropout2d(0.1)
        self.fc1 = nn.Linear(128, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 128)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, p=0.1, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train(args):
    def train_epoch(epoch):
        model.train()
        # Horovod: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                # Horovod: use train_sampler to determine the number of examples in
                # this worker's partition.
                print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                    epoch, batch_idx * len(data), len(train_sampler),
                    100. * batch_idx / len(train_loader), loss.item()), flush=True)

    def metric_average(val, name):
        tensor = torch.tensor(val)
        avg_tensor = hvd.allreduce(tensor, name=name)
        return avg_tensor.item()

    def test(epoch):
        model.eval()
        test_loss = 0.
        test_accuracy = 0.
        with torch.no_grad():
            for data, target in test_loader:
                if args.cuda:
                    data, target = data.cuda(), target.cuda()
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
        test_loss = metric_average(test_loss, "avg_loss")
        test_accuracy = metric_average(test_accuracy, "avg_accuracy")

        # Horovod: print output only on first rank.
        if hvd.rank() == 0:
            print("Test set (epoch {}): Average loss: {:.4f}, Accuracy: {:.2f}%".format(
                epoch, test_loss, 100. * test_accuracy), flush=True)

    def save_checkpoint(epoch):
        # Horovod: save on the first worker only, to prevent the others from corrupting it.
        if args.checkpoint_format and hvd.rank() == 0:
            filepath = args.checkpoint_format.format(epoch=epoch)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, filepath)

    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(args.seed)

    if args.cuda:
        # Horovod: pin GPU to local rank.
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    # Horovod: find the newest checkpoint on the first worker and tell the others.
    resume_from_epoch = 0
    if args.checkpoint_format:
        for try_epoch in range(args.epochs, 0, -1):
            if os.path.exists(args.checkpoint_format.format(epoch=try_epoch)):
                resume_from_epoch = try_epoch
                break
    resume_from_epoch = hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0, name="resume_from_epoch").item()

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

    model = Net()

    # By default, Adasum doesn't need scaling up learning rate.
    lr_scaler = hvd.size() if not args.use_adasum else 1

    if args.cuda:
        # Move model to GPU.
        model.cuda()

    # Horovod: scale learning rate by lr_scaler.
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    # Horovod: restore on the first worker, which broadcasts weights and state to the others.
    if resume_from_epoch > 0 and hvd.rank() == 0:
        checkpoint = torch.load(args.checkpoint_format.format(epoch=resume_from_epoch))
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        print("Resumed from epoch {}".format(resume_from_epoch), flush=True)
    if resume_from_epoch > 0:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    for epoch in range(resume_from_epoch + 1, args.epochs + 1):
        train_epoch(epoch)
        test(epoch)
        save_checkpoint(epoch)


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    train(args)
