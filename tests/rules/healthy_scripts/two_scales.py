"""Two models trained against each other, each initialised by PyTorch's defaults and without
normalisation layers, fed inputs of very different scales (latent codes of std 1, samples of std
100): each model's layers are consistent among themselves, the two models' are 10^4 apart.
No trainguard code: run under ``trainguard run``."""

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
generator = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
critic = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
g_optimizer = torch.optim.Adam(generator.parameters(), lr=1e-4)
c_optimizer = torch.optim.Adam(critic.parameters(), lr=1e-4)


def samples() -> torch.Tensor:
    fake = generator(torch.randn(64, 8))
    return 100.0 * fake / fake.std()  # the data's scale, whatever the generator's


for _ in range(40):
    real = 100.0 * torch.randn(64, 2)
    c_optimizer.zero_grad()
    c_loss = critic(samples().detach()).mean() - critic(real).mean()
    c_loss.backward()
    c_optimizer.step()
    g_optimizer.zero_grad()
    g_loss = -critic(samples()).mean()
    g_loss.backward()
    g_optimizer.step()
print(f"done {c_loss.item():.3f} {g_loss.item():.3f}")
