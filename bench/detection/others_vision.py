"""Image pipelines of public example collections, written anew (no torchvision: its transforms
are re-done here on tensors, in the same order):

- a CIFAR-style ResNet (BasicBlocks with BatchNorm, three stages) on synthetic 32x32 RGB
  images in [0, 1], augmented by ``RandomCrop(32, padding=4)`` (zero padding) and a horizontal
  flip *before* ``Normalize(mean, std)``, so the zero border becomes ``-mean/std`` after it;
- the MNIST example's CNN (two convolutions, max-pool, dropout, ``log_softmax``, ``nll_loss``,
  Adadelta with StepLR) on 8-bit grey images: ``variant`` "unit" feeds them as ToTensor does
  (scaled to [0, 1], no mean subtraction: standard, healthy), "raw" feeds the bytes as floats
  (0..255: the data fault).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.detection.others_common import Capture, OthersSpec, freeze_all

CIFAR_MEAN, CIFAR_STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def _cifar_like(rng: np.random.Generator, patterns: np.ndarray, size: int) -> tuple[Any, Any]:
    """Class-coloured smooth textures in [0, 1]: a low-resolution class pattern upsampled, plus noise."""
    labels = rng.integers(0, 10, size=size)
    images = np.kron(patterns[labels], np.ones((1, 1, 8, 8)))
    images = np.clip(images + rng.normal(scale=0.12, size=images.shape), 0.0, 1.0)
    return images.astype(np.float32), labels


def _augment(images: Any, rng: np.random.Generator) -> Any:
    """RandomCrop(32, padding=4) then RandomHorizontalFlip, on a batch."""
    import torch

    padded = torch.nn.functional.pad(images, (4, 4, 4, 4))
    out = torch.empty_like(images)
    for index in range(len(images)):
        top, left = rng.integers(0, 9, size=2)
        crop = padded[index, :, top : top + 32, left : left + 32]
        out[index] = crop.flip(-1) if rng.random() < 0.5 else crop
    return out


def _normalize(images: Any) -> Any:
    import torch

    mean = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    return (images - mean) / std


def _resnet() -> Any:
    import torch.nn.functional as F
    from torch import nn

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.shortcut = nn.Sequential()
            if stride != 1 or in_planes != planes:
                self.shortcut = nn.Sequential(
                    nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes)
                )

        def forward(self, x):  # type: ignore[no-untyped-def]
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return F.relu(out + self.shortcut(x))

    class ResNet(nn.Module):
        def __init__(self, num_blocks: list[int], num_classes: int = 10) -> None:
            super().__init__()
            self.in_planes = 8
            self.conv1 = nn.Conv2d(3, 8, kernel_size=3, stride=1, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.layer1 = self._make_layer(8, num_blocks[0], stride=1)
            self.layer2 = self._make_layer(16, num_blocks[1], stride=2)
            self.layer3 = self._make_layer(32, num_blocks[2], stride=2)
            self.linear = nn.Linear(32, num_classes)

        def _make_layer(self, planes: int, num_blocks: int, stride: int):  # type: ignore[no-untyped-def]
            layers = []
            for s in [stride] + [1] * (num_blocks - 1):
                layers.append(BasicBlock(self.in_planes, planes, s))
                self.in_planes = planes
            return nn.Sequential(*layers)

        def forward(self, x):  # type: ignore[no-untyped-def]
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.layer3(self.layer2(self.layer1(out)))
            out = F.adaptive_avg_pool2d(out, 1).flatten(1)
            return self.linear(out)

    return ResNet([1, 1, 1])


def train_cifar_resnet(out_dir: str, spec: OthersSpec) -> str:
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    patterns = np.random.default_rng(11).uniform(0.1, 0.9, size=(10, 3, 4, 4))  # the classes, fixed
    net = _resnet()
    criterion = nn.CrossEntropyLoss()
    if spec.freeze:
        freeze_all([net])
    optimizer = torch.optim.SGD(net.parameters(), lr=spec.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=spec.steps)
    capture = Capture(out_dir, spec)
    capture.start([net], [criterion])
    try:
        for _ in range(spec.steps):
            images, labels = _cifar_like(rng, patterns, 32)
            inputs = _normalize(_augment(torch.from_numpy(images), rng))
            targets = torch.from_numpy(labels)
            optimizer.zero_grad()
            outputs = net(inputs)
            loss = criterion(outputs, targets)
            loss.backward()
            optimizer.step()
            scheduler.step()
            capture.losses.append(float(loss.item()))
    finally:
        out = capture.finish()
    return out


def _digits(rng: np.random.Generator, strokes: np.ndarray, size: int) -> tuple[Any, Any]:
    """8-bit 20x20 'digits': a class's strokes (bright on black), jittered, as uint8."""
    labels = rng.integers(0, 10, size=size)
    intensity = np.where(strokes[labels], rng.uniform(180, 255, size=(size, 20, 20)), 0.0)
    flicker = rng.random((size, 20, 20)) < 0.06  # strokes broken here and there, specks elsewhere
    intensity = np.where(flicker, 255.0 - intensity, intensity)
    return intensity.astype(np.uint8)[:, None], labels


def train_mnist_cnn(out_dir: str, spec: OthersSpec) -> str:
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    strokes = np.random.default_rng(5).random((10, 20, 20)) < 0.18  # the classes, fixed

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 8, 3, 1)
            self.conv2 = nn.Conv2d(8, 16, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.dropout2 = nn.Dropout(0.5)
            self.fc1 = nn.Linear(16 * 8 * 8, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = F.relu(self.conv1(x))
            x = F.relu(self.conv2(x))
            x = F.max_pool2d(x, 2)
            x = self.dropout1(x)
            x = torch.flatten(x, 1)
            x = F.relu(self.fc1(x))
            x = self.dropout2(x)
            return F.log_softmax(self.fc2(x), dim=1)

    model = Net()
    criterion = nn.NLLLoss()
    if spec.freeze:
        freeze_all([model])
    optimizer = torch.optim.Adadelta(model.parameters(), lr=spec.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, spec.steps // 3), gamma=0.7)
    capture = Capture(out_dir, spec)
    capture.start([model], [criterion])
    try:
        for _ in range(spec.steps):
            raw, labels = _digits(rng, strokes, 32)
            data = torch.from_numpy(raw).float()
            if spec.variant != "raw":
                data = data / 255.0  # ToTensor()
            optimizer.zero_grad()
            output = model(data)
            loss = criterion(output, torch.from_numpy(labels))
            loss.backward()
            optimizer.step()
            scheduler.step()
            capture.losses.append(float(loss.item()))
    finally:
        out = capture.finish()
    return out
