"""Every model family: output shape, logits (no softmax), and a falling loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mmfl_flwr.tasks.zoo import CNN, CharLSTM, LogisticRegression, PreActResNet18


def _train(model, x, y, steps, lr, momentum=0.9):
    """Plain SGD on one fixed batch; returns the losses before and after."""
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    with torch.no_grad():
        final = float(F.cross_entropy(model(x), y))
    return losses[0], final


def _assert_logits(out, batch, classes):
    assert out.shape == (batch, classes)
    sums = out.detach().sum(dim=1)
    assert not torch.allclose(sums, torch.ones_like(sums), atol=1e-3)  # not probabilities
    assert (out.detach() < 0).any()  # softmax outputs would all be positive


@pytest.mark.parametrize(
    "in_ch,size,classes",
    [(1, 28, 10), (1, 28, 47), (3, 32, 10), (3, (20, 16), 2), (1, 8, 10)],
)
def test_cnn_shapes(in_ch, size, classes):
    torch.manual_seed(0)
    model = CNN(in_ch, size, classes)
    h, w = (size, size) if isinstance(size, int) else size
    out = model(torch.rand(4, in_ch, h, w))
    _assert_logits(out, 4, classes)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(convs) == 2 and len(linears) == 2


def test_cnn_trains():
    torch.manual_seed(0)
    model = CNN(1, 28, 47)
    # 16 images of 16 classes; each class has a bright 4x4 patch at its own place
    y = torch.arange(16)
    x = 0.5 * torch.rand(16, 1, 28, 28)
    for i, c in enumerate(y.tolist()):
        x[i, 0, (c // 7) * 4 : (c // 7) * 4 + 4, (c % 7) * 4 : (c % 7) * 4 + 4] += 1.0
    first, last = _train(model, x, y, steps=10, lr=0.05)
    assert last < 0.8 * first


def test_preact_resnet18_shapes_and_trains():
    torch.manual_seed(0)
    model = PreActResNet18(10)
    n_params = sum(p.numel() for p in model.parameters())
    assert 11_000_000 < n_params < 11_300_000  # ResNet-18 size
    x, y = torch.rand(8, 3, 32, 32), torch.arange(8) % 10
    _assert_logits(model(x), 8, 10)
    first, last = _train(model, x, y, steps=3, lr=0.05)
    assert last < 0.8 * first
    model.eval()
    with torch.no_grad():  # single-channel 28x28 (MNIST) works too
        assert PreActResNet18(10, in_channels=1)(torch.rand(2, 1, 28, 28)).shape == (2, 10)


def test_char_lstm_shapes_and_trains():
    torch.manual_seed(0)
    model = CharLSTM(80, embed_dim=8, hidden=64)
    x = torch.randint(0, 80, (16, 20))
    y = torch.randint(0, 80, (16,))
    _assert_logits(model(x), 16, 80)
    assert model(x.float()).shape == (16, 80)  # float-stored indices are accepted
    first, last = _train(model, x, y, steps=40, lr=0.5)
    assert last < 0.7 * first
    big = CharLSTM(80)
    assert big.lstm.num_layers == 2 and big.lstm.hidden_size == 256
    assert big.embedding.embedding_dim == 8


def test_logistic_regression_shapes_and_trains():
    torch.manual_seed(0)
    model = LogisticRegression(60, 5)
    x, y = torch.randn(32, 60), torch.randint(0, 5, (32,))
    _assert_logits(model(x), 32, 5)
    assert model(torch.randn(3, 6, 10)).shape == (3, 5)  # inputs are flattened
    first, last = _train(model, x, y, steps=30, lr=0.1)
    assert last < 0.5 * first
