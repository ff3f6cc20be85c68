"""A small DCGAN as the PyTorch tutorial writes it (Generator and Discriminator classes that both keep
their layers in `main`), N(0, 0.02) init, BatchNorm, two Adam optimizers, synthetic blob images.
No trainguard code: run under ``trainguard run``. Argument: the number of steps (default 40)."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
nz, ngf, ndf, batch, side = 16, 16, 16, 32, 16


def weights_init(m):
    name = m.__class__.__name__
    if name.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif name.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, 1, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, x):
        return self.main(x)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(1, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.main(x)


def real_images(n):
    yy, xx = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    centres = torch.tensor([[4.0, 4.0], [4.0, 11.0], [11.0, 4.0], [11.0, 11.0]])[torch.randint(0, 4, (n,))]
    distance = (yy[None] - centres[:, 0, None, None]) ** 2 + (xx[None] - centres[:, 1, None, None]) ** 2
    return (torch.exp(-distance / 8.0) * 2 - 1)[:, None]


netG, netD = Generator(), Discriminator()
netG.apply(weights_init)
netD.apply(weights_init)
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
for _ in range(steps):
    real = real_images(batch)
    netD.zero_grad()
    label = torch.full((batch,), 1.0)
    errD_real = criterion(netD(real).view(-1), label)
    errD_real.backward()
    fake = netG(torch.randn(batch, nz, 1, 1))
    label.fill_(0.0)
    errD_fake = criterion(netD(fake.detach()).view(-1), label)
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    label.fill_(1.0)
    errG = criterion(netD(fake).view(-1), label)
    errG.backward()
    optimizerG.step()
print(f"done D {float(errD_real + errD_fake):.3f} G {errG.item():.3f}")
