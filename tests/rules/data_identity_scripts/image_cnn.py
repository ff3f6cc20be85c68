"""A small CNN on synthetic colour images, fed through the usual image pipelines:

* ``padded``: CIFAR's augmentation, a random crop with zero padding (``RandomCrop(16, padding=2)``)
  of [0, 1] images, then ``Normalize`` with the data set's channel mean and std;
* ``unit``: ``ToTensor()`` only, values in [0, 1] (mean ~0.3);
* ``raw``: the uint8 pixel values as floats, 0..255 (a data fault).

``--labels one_class``: every label is class 0 (a loading bug; the model still has 4 outputs)."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--pipeline", choices=["padded", "unit", "raw"], default="padded")
parser.add_argument("--labels", choices=["ok", "one_class"], default="ok")
parser.add_argument("--steps", type=int, default=250)
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
CLASSES, SIZE, PAD = 4, 16, 2

# Each class: a colour tint and a bright square in its own quadrant, on textured noise
tints = torch.rand(CLASSES, 3, 1, 1) * 0.1
pixels_per_class = []


def images_of(labels):
    noise = torch.rand(labels.numel(), 3, SIZE, SIZE)
    images = noise * 0.6 + tints[labels]
    for index, label in enumerate(labels.tolist()):
        row, column = divmod(label, 2)
        images[index, :, row * 8 + 3 : row * 8 + 5, column * 8 + 3 : column * 8 + 5] += 0.25
    return (images.clamp(0, 1) * 255).round() / 255  # 8-bit images, as a data set stores them


sample = images_of(torch.randint(0, CLASSES, (2000,)))
mean, std = sample.mean((0, 2, 3)), sample.std((0, 2, 3))


def pipeline(images):
    if args.pipeline == "raw":
        return images * 255
    if args.pipeline == "unit":
        return images
    padded = F.pad(images, (PAD, PAD, PAD, PAD))  # zero padding, then a random crop per image
    crops = torch.empty_like(images)
    for index in range(images.shape[0]):
        top, left = torch.randint(0, 2 * PAD + 1, (2,)).tolist()
        crops[index] = padded[index, :, top : top + SIZE, left : left + SIZE]
    return (crops - mean[:, None, None]) / std[:, None, None]


model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 4 * 4, CLASSES),
)
optimizer = torch.optim.Adam(model.parameters(), lr=0.002)
correct = seen = 0
for step in range(args.steps):
    labels = torch.randint(0, CLASSES, (32,))
    images = pipeline(images_of(labels))
    targets = torch.zeros_like(labels) if args.labels == "one_class" else labels
    logits = model(images)
    loss = F.cross_entropy(logits, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step >= args.steps - 50:
        correct += (logits.argmax(1) == targets).sum().item()
        seen += targets.numel()
print(f"done loss {loss.item():.3f} accuracy over the last 50 steps {correct / seen:.2f}")
