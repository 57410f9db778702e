"""What a Flower quickstart's task.py holds: a model, the client's data
loaders, and train/test functions, here for two small classification tasks
("blobs" in 2-D and "rings" in 3-D) generated from the partition id."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

TASKS = {"blobs": (2, 3), "rings": (3, 2)}  # name -> (input dims, classes)


class Net(nn.Module):
    def __init__(self, dims: int, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dims, 16), nn.ReLU(), nn.Linear(16, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def make_data(task: str, seed: int, n: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    dims, classes = TASKS[task]
    y = torch.randint(0, classes, (n,), generator=g)
    if task == "blobs":
        centers = torch.tensor([[0.0, 0.0], [3.0, 3.0], [0.0, 4.0]])
        x = centers[y] + torch.randn(n, dims, generator=g)
    else:  # class 1 lies on a shell of radius 3 around class 0's ball
        x = torch.randn(n, dims, generator=g)
        x = x / x.norm(dim=1, keepdim=True) * (0.5 + 2.5 * y.unsqueeze(1).float())
        x = x + 0.3 * torch.randn(n, dims, generator=g)
    return TensorDataset(x, y)


def load_data(task: str, partition_id: int) -> tuple[DataLoader, DataLoader]:
    train = make_data(task, 1000 + partition_id, 120)
    test = make_data(task, 5000 + partition_id, 60)
    g = torch.Generator().manual_seed(partition_id)
    return DataLoader(train, batch_size=16, shuffle=True, generator=g), DataLoader(test, 60)


def train(
    net: nn.Module, trainloader: DataLoader, epochs: int, lr: float, device: torch.device
) -> float:
    """Plain SGD; the mean training loss."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    criterion = nn.CrossEntropyLoss()
    total, batches = 0.0, 0
    for _ in range(epochs):
        for x, y in trainloader:
            opt.zero_grad()
            loss = criterion(net(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            total, batches = total + float(loss), batches + 1
    return total / max(batches, 1)


def test(net: nn.Module, loader: DataLoader, device: torch.device) -> tuple[float, float]:
    """(mean loss, accuracy)."""
    criterion = nn.CrossEntropyLoss(reduction="sum")
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = net(x.to(device))
            loss += float(criterion(out, y.to(device)))
            correct += int((out.argmax(1) == y.to(device)).sum())
            n += len(y)
    return loss / n, correct / n
