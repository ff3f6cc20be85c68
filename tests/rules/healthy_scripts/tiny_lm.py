"""A healthy tiny transformer language model: next-token labels (a vocabulary's frequencies),
AdamW with warm-up and cosine decay, gradient clipping, no validation."""

import argparse
import math

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=800)
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
VOCABULARY, LENGTH = 50, 16


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, 32)
        self.position = nn.Parameter(torch.zeros(LENGTH, 32))
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(32, VOCABULARY)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.size(1))
        hidden = self.embedding(tokens) + self.position[: tokens.size(1)]
        return self.head(self.encoder(hidden, mask=mask, is_causal=True))


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
steps = args.steps
warm_up_then_cosine = lambda s: min(1.0, (s + 1) / 80) * 0.5 * (1 + math.cos(math.pi * s / steps))  # noqa: E731
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warm_up_then_cosine)
corpus = torch.randint(0, VOCABULARY, (200,))
for _ in range(steps):
    starts = torch.randint(0, 200 - LENGTH - 1, (32,))
    sequences = torch.stack([corpus[s : s + LENGTH + 1] for s in starts])
    logits = model(sequences[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY), sequences[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
print(f"done loss {loss.item():.4f}")
