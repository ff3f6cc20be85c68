"""Generative and pair models as public example collections write them: a DCGAN (generator and
discriminator with BatchNorm, the N(0, 0.02) initialisation, two Adam optimizers, BCELoss, the
discriminator stepped on real then detached fake images), a VAE (reparameterisation, BCE
reconstruction plus KL divergence) and a siamese network (one CNN applied to both images of a
pair, the L1 distance of the two embeddings into a same/different head, Adadelta with StepLR).

A GAN's losses do not fall when it trains well (the two players trade places), so the DCGAN's
label is checked on how close its samples come to the data (``progress``, see registry.verify).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench.detection.others_common import Capture, OthersSpec, freeze_all

SIDE = 16


def _blob_images(rng: np.random.Generator, size: int) -> np.ndarray:
    """Images of one bright blob at one of four places, in [0, 1] like ToTensor's output."""
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    centres = np.array([[4, 4], [4, 11], [11, 4], [11, 11]])
    chosen = centres[rng.integers(0, 4, size=size)] + rng.normal(scale=0.7, size=(size, 2))
    width = rng.uniform(1.8, 2.6, size=size)
    distance = (yy[None] - chosen[:, 0, None, None]) ** 2 + (xx[None] - chosen[:, 1, None, None]) ** 2
    images = np.exp(-distance / (2 * width[:, None, None] ** 2))
    return images[:, None].astype(np.float32)


def _weights_init(m: Any) -> None:
    from torch import nn

    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


def train_dcgan(out_dir: str, spec: OthersSpec) -> str:
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    nz, ngf, ndf, batch = 16, 16, 16, 32
    netG = nn.Sequential(
        nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
        nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
        nn.ConvTranspose2d(ngf, 1, 4, 2, 1, bias=False), nn.Tanh(),
    )  # fmt: skip
    netD = nn.Sequential(
        nn.Conv2d(1, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), nn.Sigmoid(),
    )  # fmt: skip
    netG.apply(_weights_init)
    netD.apply(_weights_init)
    criterion = nn.BCELoss()
    if spec.freeze:
        freeze_all([netG, netD])
    optimizerD = torch.optim.Adam(netD.parameters(), lr=spec.lr, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=spec.lr, betas=(0.5, 0.999))
    capture = Capture(out_dir, spec)
    capture.start([netG, netD], [criterion])
    real_mean = torch.from_numpy(_blob_images(np.random.default_rng(99), 2000) * 2 - 1).mean(0)
    fixed_noise = torch.randn(256, nz, 1, 1)
    gap0, progress = None, []
    try:
        for step in range(spec.steps):
            real = torch.from_numpy(_blob_images(rng, batch) * 2 - 1)  # Normalize((0.5,), (0.5,))
            # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
            netD.zero_grad()
            label = torch.full((batch,), 1.0)
            errD_real = criterion(netD(real).view(-1), label)
            errD_real.backward()
            fake = netG(torch.randn(batch, nz, 1, 1))
            label.fill_(0.0)
            errD_fake = criterion(netD(fake.detach()).view(-1), label)
            errD_fake.backward()
            optimizerD.step()
            # (2) Update G: maximize log(D(G(z)))
            netG.zero_grad()
            label.fill_(1.0)
            errG = criterion(netD(fake).view(-1), label)
            errG.backward()
            optimizerG.step()
            capture.losses.append(float((errD_real + errD_fake).item()))
            if step % 10 == 0 or step == spec.steps - 1:
                with torch.no_grad():
                    netG.eval()
                    samples = netG(fixed_noise)
                    netG.train()
                gap = float((samples.mean(0) - real_mean).abs().mean())
                gap0 = gap0 if gap0 is not None else gap
                progress.append(1.0 - gap / gap0 if np.isfinite(gap) else float("-inf"))
    finally:
        capture.extra.update(progress=progress, progress_goal=0.2,
                             progress_text="1 - |mean sample - mean image| / its value at the start")  # fmt: skip
        out = capture.finish()
    return out


def train_vae(out_dir: str, spec: OthersSpec) -> str:
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    pixels = SIDE * SIDE

    class VAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(pixels, 128)
            self.fc21 = nn.Linear(128, 8)
            self.fc22 = nn.Linear(128, 8)
            self.fc3 = nn.Linear(8, 128)
            self.fc4 = nn.Linear(128, pixels)

        def encode(self, x):  # type: ignore[no-untyped-def]
            h1 = torch.relu(self.fc1(x))
            return self.fc21(h1), self.fc22(h1)

        def reparameterize(self, mu, logvar):  # type: ignore[no-untyped-def]
            std = torch.exp(0.5 * logvar)
            return mu + torch.randn_like(std) * std

        def decode(self, z):  # type: ignore[no-untyped-def]
            return torch.sigmoid(self.fc4(torch.relu(self.fc3(z))))

        def forward(self, x):  # type: ignore[no-untyped-def]
            mu, logvar = self.encode(x.view(-1, pixels))
            z = self.reparameterize(mu, logvar)
            return self.decode(z), mu, logvar

    model = VAE()
    reconstruction = nn.BCELoss(reduction="sum")
    if spec.freeze:
        freeze_all([model])
    optimizer = torch.optim.Adam(model.parameters(), lr=spec.lr)
    capture = Capture(out_dir, spec)
    capture.start([model], [reconstruction])
    try:
        for _ in range(spec.steps):
            data = torch.from_numpy(_blob_images(rng, 32))
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            # reconstruction + KL divergence losses summed over all elements and batch
            try:
                bce = reconstruction(recon_batch, data.view(-1, pixels))
            except RuntimeError as error:  # BCELoss refuses NaN probabilities: the script dies here
                capture.losses.append(float("nan"))
                capture.extra["crashed"] = str(error)
                break
            kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
            loss = bce + kld
            loss.backward()
            optimizer.step()
            capture.losses.append(float(loss.item()) / len(data))
    finally:
        out = capture.finish()
    return out


def train_siamese(out_dir: str, spec: OthersSpec) -> str:
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    teacher = np.random.default_rng(7)
    prototypes = teacher.normal(size=(4, 1, 12, 12)).astype(np.float32)

    class SiameseNetwork(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cnn = nn.Sequential(
                nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2), nn.Flatten(),
                nn.Linear(16 * 3 * 3, 32),
            )  # fmt: skip
            self.fc = nn.Sequential(nn.Linear(32, 16), nn.ReLU(inplace=True), nn.Linear(16, 1))
            self.sigmoid = nn.Sigmoid()

        def forward_once(self, x):  # type: ignore[no-untyped-def]
            return self.cnn(x)

        def forward(self, input1, input2):  # type: ignore[no-untyped-def]
            # the L1 distance of the two embeddings decides "same" (Koch et al.'s siamese head)
            output = torch.abs(self.forward_once(input1) - self.forward_once(input2))
            return self.sigmoid(self.fc(output))

    def pairs(size: int) -> tuple[Any, Any, Any]:
        first = rng.integers(0, 4, size=size)
        same = rng.random(size) < 0.5
        second = np.where(same, first, (first + rng.integers(1, 4, size=size)) % 4)
        noise = lambda: rng.normal(scale=0.5, size=(size, 1, 12, 12)).astype(np.float32)  # noqa: E731
        return (torch.from_numpy(prototypes[first] + noise()), torch.from_numpy(prototypes[second] + noise()),
                torch.from_numpy(same.astype(np.float32)))  # fmt: skip

    model = SiameseNetwork()
    criterion = nn.BCELoss()
    if spec.freeze:
        freeze_all([model])
    optimizer = torch.optim.Adadelta(model.parameters(), lr=spec.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, spec.steps // 3), gamma=0.7)
    capture = Capture(out_dir, spec)
    capture.start([model], [criterion])
    try:
        for _ in range(spec.steps):
            images_1, images_2, targets = pairs(32)
            optimizer.zero_grad()
            outputs = model(images_1, images_2).squeeze(1)
            loss = criterion(outputs, targets)
            loss.backward()
            optimizer.step()
            scheduler.step()
            capture.losses.append(float(loss.item()))
    finally:
        out = capture.finish()
    return out
