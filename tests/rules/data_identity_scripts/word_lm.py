"""A word-level language model as in PyTorch's classic example (word_language_model): an LSTM, GRU
or tanh RNN whose hidden state is passed back into its own forward, detached between batches
(``repackage_hidden``); plain SGD written out with gradient clipping, no torch optimizer. The
corpus is drawn from a Markov chain over a Zipf-distributed vocabulary, so it can be learnt."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--cell", default="LSTM", choices=["LSTM", "GRU", "RNN_TANH", "TRANSFORMER"])
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--lr", type=float, default=5.0)
args = parser.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
VOCABULARY, BATCH, BPTT = 120, 16, 20

# A corpus with structure: each word's successor is one of 3 words (Zipf-weighted start)
successors = torch.randint(0, VOCABULARY, (VOCABULARY, 3))
words = [0]
for _ in range(BATCH * BPTT * 40):
    words.append(int(successors[words[-1], torch.randint(0, 3, ()).item()]))
corpus = torch.tensor(words)
data = corpus[: corpus.numel() // BATCH * BATCH].view(BATCH, -1).t().contiguous()  # (T, B), as batchify()


class RNNModel(nn.Module):
    def __init__(self, cell: str) -> None:
        super().__init__()
        self.cell = cell
        self.encoder = nn.Embedding(VOCABULARY, 32)
        if cell == "TRANSFORMER":
            layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0)
            self.rnn = nn.TransformerEncoder(layer, 2)
        elif cell == "RNN_TANH":
            self.rnn = nn.RNN(32, 64, 2, nonlinearity="tanh")
        else:
            self.rnn = getattr(nn, cell)(32, 64, 2)
        self.decoder = nn.Linear(32 if cell == "TRANSFORMER" else 64, VOCABULARY)

    def forward(self, tokens, hidden=None):
        embedded = self.encoder(tokens)
        if self.cell == "TRANSFORMER":
            mask = nn.Transformer.generate_square_subsequent_mask(tokens.size(0))
            output = self.rnn(embedded, mask=mask, is_causal=True)
            return self.decoder(output).view(-1, VOCABULARY)
        output, hidden = self.rnn(embedded, hidden)
        return self.decoder(output).view(-1, VOCABULARY), hidden

    def init_hidden(self, batch):
        weight = next(self.parameters())
        if self.cell == "LSTM":
            return weight.new_zeros(2, batch, 64), weight.new_zeros(2, batch, 64)
        return weight.new_zeros(2, batch, 64)


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


model = RNNModel(args.cell)
criterion = nn.CrossEntropyLoss()
step, first, last = 0, None, None
while step < args.steps:
    hidden = model.init_hidden(BATCH)
    for start in range(0, data.size(0) - 1 - BPTT, BPTT):
        if step >= args.steps:
            break
        tokens, targets = data[start : start + BPTT], data[start + 1 : start + 1 + BPTT].reshape(-1)
        model.zero_grad()
        if args.cell == "TRANSFORMER":
            output = model(tokens)
        else:
            hidden = repackage_hidden(hidden)
            output, hidden = model(tokens, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-args.lr)
        first = loss.item() if first is None else first
        last = loss.item()
        step += 1
print(f"done loss {first:.3f} -> {last:.3f}")
