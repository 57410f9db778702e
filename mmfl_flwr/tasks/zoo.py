"""The papers' models (torch). Every model returns logits: the softmax belongs to the
cross-entropy loss (``torch.nn.functional.cross_entropy``), never to the model.

* :class:`CNN`: 2 convolutional, 2 pooling and 2 linear layers (papers 000, 001 and
  003 for Fashion-MNIST / EMNIST; paper 002/004's CelebA CNN), sized from the input;
* :class:`PreActResNet18`: the pre-activation ResNet-18 of He et al. (2016) (CIFAR-10
  and MNIST in papers 000/001/003);
* :class:`CharLSTM`: embedding, 2-layer LSTM, linear (paper 003's Shakespeare model);
* :class:`LogisticRegression`: one linear layer (Synthetic(1, 1)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CNN", "PreActBlock", "PreActResNet18", "CharLSTM", "LogisticRegression"]


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    h, w = size
    return int(h), int(w)


class CNN(nn.Module):
    """conv(5x5, pad 2) - ReLU - maxpool 2 - conv(5x5, pad 2) - ReLU - maxpool 2 -
    linear - ReLU - linear (McMahan et al.'s FedAvg CNN, sized from the input).

    Parameters
    ----------
    in_channels : int
        Input channels (1 for (Fashion-)MNIST / EMNIST, 3 for CIFAR-10 / CelebA).
    image_size : int or (int, int)
        Input height and width (at least 4); the flatten size is
        ``channels[1] * (h // 4) * (w // 4)``.
    num_classes : int
        Output logits.
    channels : (int, int), default (32, 64)
        Output channels of the two convolutions.
    hidden : int, default 512
        Width of the first linear layer.
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int | tuple[int, int],
        num_classes: int,
        channels: tuple[int, int] = (32, 64),
        hidden: int = 512,
    ) -> None:
        super().__init__()
        h, w = _pair(image_size)
        if h < 4 or w < 4:
            raise ValueError(f"image_size must be at least 4x4, got {(h, w)}")
        self.conv1 = nn.Conv2d(in_channels, channels[0], kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(channels[0], channels[1], kernel_size=5, padding=2)
        self.pool = nn.MaxPool2d(2)
        self.flat_features = channels[1] * (h // 2 // 2) * (w // 2 // 2)
        self.fc1 = nn.Linear(self.flat_features, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, in_channels, h, w)`` to logits ``(B, num_classes)``."""
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, start_dim=1)
        return self.fc2(F.relu(self.fc1(x)))


class PreActBlock(nn.Module):
    """Pre-activation basic block: BN - ReLU - conv3x3 - BN - ReLU - conv3x3, plus the
    shortcut (a strided 1x1 convolution of the pre-activated input when the shape
    changes, else the identity)."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.shortcut: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        shortcut = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + shortcut


class PreActResNet18(nn.Module):
    """Pre-activation ResNet-18 (He et al., "Identity Mappings in Deep Residual
    Networks", 2016), CIFAR variant: conv3x3(64), four stages of two
    :class:`PreActBlock` (64, 128, 256, 512 channels; stride 2 from the second stage),
    final BN - ReLU, global average pooling, linear. Any input of at least 8x8 works
    (e.g. 28x28 MNIST).

    Parameters
    ----------
    num_classes : int
        Output logits.
    in_channels : int, default 3
        Input channels.
    """

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        planes = 64
        stages = []
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(
                nn.Sequential(PreActBlock(planes, width, stride), PreActBlock(width, width, 1))
            )
            planes = width
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.bn = nn.BatchNorm2d(512)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, in_channels, h, w)`` to logits ``(B, num_classes)``."""
        out = self.conv1(x)
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.relu(self.bn(out))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


class CharLSTM(nn.Module):
    """Next-character model: embedding - LSTM (``num_layers``) - linear on the last
    time step (LEAF's / paper 003's Shakespeare model).

    Parameters
    ----------
    vocab_size : int
        Characters (80 for LEAF's Shakespeare); also the number of logits.
    embed_dim : int, default 8
        Embedding width.
    hidden : int, default 256
        LSTM hidden size.
    num_layers : int, default 2
        Stacked LSTM layers.
    """

    def __init__(
        self, vocab_size: int, embed_dim: int = 8, hidden: int = 256, num_layers: int = 2
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=num_layers, batch_first=True)
        self.linear = nn.Linear(hidden, vocab_size)
        #: compute the LSTM step by step from its weights instead of the fused
        #: kernel (the same math; ``torch.func.vmap`` batches it, which it cannot
        #: do for the fused CPU and cuDNN kernels). Set by the vectorised engine.
        self.unfused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map character indices ``(B, T)`` (any numeric dtype; cast to long) to
        next-character logits ``(B, vocab_size)``."""
        emb = self.embedding(x.long())
        if self.unfused:
            return self.linear(lstm_last_hidden(self.lstm, emb))
        out, _ = self.lstm(emb)
        return self.linear(out[:, -1, :])


def lstm_last_hidden(lstm: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """The top layer's hidden state after the last step of a batch-first, one-way
    :class:`torch.nn.LSTM` with zero initial state, computed from its weights
    (gates i, f, g, o as in PyTorch): what ``lstm(x)[0][:, -1]`` returns."""
    if not lstm.batch_first or lstm.bidirectional or lstm.proj_size:
        raise ValueError("lstm_last_hidden supports batch-first one-way LSTMs only")
    seq = x
    h = seq.new_zeros(())
    for layer in range(lstm.num_layers):
        w_ih = getattr(lstm, f"weight_ih_l{layer}")
        w_hh = getattr(lstm, f"weight_hh_l{layer}")
        b = getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
        # the input part of every step at once, then the recurrence
        pre = F.linear(seq, w_ih, b)
        h = seq.new_zeros((seq.shape[0], lstm.hidden_size))
        c = torch.zeros_like(h)
        outs = []
        for t in range(seq.shape[1]):
            i, f, g, o = (pre[:, t] + F.linear(h, w_hh)).chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        seq = torch.stack(outs, dim=1)
    return h


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: flatten, then one linear layer (logits).

    Parameters
    ----------
    dim : int
        Input dimension (after flattening).
    classes : int
        Output logits.
    """

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, ...)`` with ``dim`` features to logits ``(B, classes)``."""
        return self.linear(torch.flatten(x, start_dim=1))
