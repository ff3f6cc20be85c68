"""How many optimizers step disjoint parameters each after a forward of its own (a GAN): the
hook records it in the collections file's _meta, where LossNotDecreasing reads it."""

from __future__ import annotations

import torch
from torch import nn

import trainguard.pytorch as tg
from trainguard.trials import create_trial


def _hook(out, *models) -> tg.Hook:
    hook = tg.Hook(out_dir=str(out), save_config=tg.SaveConfig(save_interval=1), include_collections=["losses"])
    for model in models:
        hook.register_module(model)
    return hook


def test_a_gan_has_two_independent_optimizers(tmp_path):
    torch.manual_seed(0)
    generator, discriminator = nn.Linear(4, 2), nn.Linear(2, 1)
    og, od = torch.optim.Adam(generator.parameters()), torch.optim.Adam(discriminator.parameters())
    hook = _hook(tmp_path / "gan", generator, discriminator)
    bce = nn.BCEWithLogitsLoss()
    for _ in range(3):
        z, real = torch.randn(8, 4), torch.randn(8, 2)
        od.zero_grad()
        d_loss = bce(discriminator(real), torch.ones(8, 1)) + bce(discriminator(generator(z).detach()), torch.zeros(8, 1))
        d_loss.backward()
        od.step()
        og.zero_grad()
        bce(discriminator(generator(z)), torch.ones(8, 1)).backward()
        og.step()
    hook.close()
    assert create_trial(str(tmp_path / "gan")).independent_optimizers == 2


def test_optimizers_sharing_one_backward_or_one_optimizer_are_one_objective(tmp_path):
    torch.manual_seed(0)
    embedding, dense = nn.Embedding(10, 4), nn.Linear(4, 1)
    model = nn.Sequential(embedding, dense)
    sparse_part, dense_part = torch.optim.SGD(embedding.parameters(), lr=0.1), torch.optim.Adam(dense.parameters())
    hook = _hook(tmp_path / "split", model)
    for _ in range(3):
        sparse_part.zero_grad(), dense_part.zero_grad()
        model(torch.randint(0, 10, (8,))).pow(2).mean().backward()
        sparse_part.step()
        dense_part.step()  # the same loss, two optimizers: not competing
    hook.close()
    assert create_trial(str(tmp_path / "split")).independent_optimizers == 1

    single = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(single.parameters(), lr=0.1)
    hook = _hook(tmp_path / "single", single)
    for _ in range(3):
        optimizer.zero_grad()
        single(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()
    hook.close()
    trial = create_trial(str(tmp_path / "single"))
    assert trial.independent_optimizers == 1
