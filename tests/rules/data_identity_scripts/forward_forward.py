"""Hinton's forward-forward algorithm, written as the popular PyTorch implementation is: each layer
trains itself with its own optimizer and calls its own ``forward()`` directly (no module call:
its ReLU is the first module call trainguard sees, fed a pre-activation); the layers sit in a
plain list, and prediction goes through ``layer(h)``. Inputs are standardised synthetic
"images" with the label overlaid on the first features."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=150)
parser.add_argument("--scale", type=float, default=1.0, help="multiply the inputs (1e4: a data fault)")
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
CLASSES, FEATURES, SAMPLES = 4, 48, 256

centres = torch.randn(CLASSES, FEATURES)
labels = torch.randint(0, CLASSES, (SAMPLES,))
x = centres[labels] + 0.7 * torch.randn(SAMPLES, FEATURES)
x = (x - x.mean(0)) / x.std(0) * args.scale


def overlay(x, y):
    x = x.clone()
    x[:, :CLASSES] = 0.0
    x[range(x.shape[0]), y] = x.abs().max()
    return x


class Layer(nn.Linear):
    def __init__(self, inputs, outputs):
        super().__init__(inputs, outputs)
        self.relu = nn.ReLU()
        self.opt = torch.optim.Adam(self.parameters(), lr=0.03)
        self.threshold = 2.0

    def forward(self, x):
        direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
        return self.relu(torch.mm(direction, self.weight.T) + self.bias.unsqueeze(0))

    def train_layer(self, positive, negative):
        for _ in range(args.epochs):
            good_positive = self.forward(positive).pow(2).mean(1)
            good_negative = self.forward(negative).pow(2).mean(1)
            loss = torch.log(1 + torch.exp(torch.cat([-good_positive + self.threshold,
                                                      good_negative - self.threshold]))).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
        return self.forward(positive).detach(), self.forward(negative).detach(), loss.item()


class Net(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.layers = [Layer(dims[d], dims[d + 1]) for d in range(len(dims) - 1)]  # a plain list, as written

    def predict(self, x):
        goodness_per_label = []
        for label in range(CLASSES):
            h = overlay(x, torch.full((x.shape[0],), label))
            goodness = []
            for layer in self.layers:
                h = layer(h)
                goodness.append(h.pow(2).mean(1))
            goodness_per_label.append(sum(goodness).unsqueeze(1))
        return torch.cat(goodness_per_label, 1).argmax(1)

    def train_net(self, positive, negative):
        losses = []
        for layer in self.layers:
            positive, negative, loss = layer.train_layer(positive, negative)
            losses.append(loss)
        return losses


net = Net([FEATURES, 64, 64])
positive = overlay(x, labels)
negative = overlay(x, (labels + torch.randint(1, CLASSES, labels.shape)) % CLASSES)
losses = net.train_net(positive, negative)
with torch.no_grad():
    accuracy = (net.predict(x) == labels).float().mean().item()
print(f"done layer losses {[round(v, 3) for v in losses]} train accuracy {accuracy:.2f}")
