"""Word-level language models as the public word-language-model example writes them: a token
stream batchified into columns, BPTT windows, an RNN (LSTM, GRU or tanh) whose hidden state is
carried from window to window (``hidden = repackage_hidden(hidden)``), gradient clipping and a
hand-written SGD update ``p.data.add_(p.grad, alpha=-lr)``; or a causal Transformer encoder
over the same windows. The text comes from a small Markov source (:func:`markov_text`), so the
targets are next words over a 200-word vocabulary: not class labels.
"""

from __future__ import annotations

import math
from typing import Any

from bench.detection.others_common import Capture, OthersSpec, freeze_all, markov_text

VOCAB, BPTT, BATCH, EVAL_BATCH = 200, 20, 16, 10


def _models() -> tuple[type, type]:
    import torch
    from torch import nn

    class RNNModel(nn.Module):
        """Encoder, a recurrent module and a decoder (weights not tied)."""

        def __init__(self, rnn_type: str, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float) -> None:
            super().__init__()
            self.drop = nn.Dropout(dropout)
            self.encoder = nn.Embedding(ntoken, ninp)
            if rnn_type in ("LSTM", "GRU"):
                self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
            else:
                self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity="tanh", dropout=dropout)
            self.decoder = nn.Linear(nhid, ntoken)
            self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers
            initrange = 0.1
            nn.init.uniform_(self.encoder.weight, -initrange, initrange)
            nn.init.zeros_(self.decoder.bias)
            nn.init.uniform_(self.decoder.weight, -initrange, initrange)

        def forward(self, input, hidden):  # type: ignore[no-untyped-def]
            emb = self.drop(self.encoder(input))
            output, hidden = self.rnn(emb, hidden)
            output = self.drop(output)
            decoded = self.decoder(output).view(-1, self.decoder.out_features)
            return torch.log_softmax(decoded, dim=1), hidden

        def init_hidden(self, bsz: int):  # type: ignore[no-untyped-def]
            weight = next(self.parameters())
            if self.rnn_type == "LSTM":
                return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
            return weight.new_zeros(self.nlayers, bsz, self.nhid)

    class PositionalEncoding(nn.Module):
        def __init__(self, d_model: int, dropout: float, max_len: int = 64) -> None:
            super().__init__()
            self.dropout = nn.Dropout(p=dropout)
            position = torch.arange(max_len).unsqueeze(1)
            div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
            pe = torch.zeros(max_len, 1, d_model)
            pe[:, 0, 0::2] = torch.sin(position * div_term)
            pe[:, 0, 1::2] = torch.cos(position * div_term)
            self.register_buffer("pe", pe)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.dropout(x + self.pe[: x.size(0)])

    class TransformerModel(nn.Module):
        def __init__(self, ntoken: int, ninp: int, nhead: int, nhid: int, nlayers: int, dropout: float) -> None:
            super().__init__()
            self.pos_encoder = PositionalEncoding(ninp, dropout)
            layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout)
            self.transformer_encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
            self.encoder = nn.Embedding(ntoken, ninp)
            self.decoder = nn.Linear(ninp, ntoken)
            self.ninp = ninp
            nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
            nn.init.zeros_(self.decoder.bias)
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

        def forward(self, src, mask):  # type: ignore[no-untyped-def]
            src = self.pos_encoder(self.encoder(src) * math.sqrt(self.ninp))
            output = self.transformer_encoder(src, mask)
            return torch.log_softmax(self.decoder(output), dim=-1)

    return RNNModel, TransformerModel


def batchify(data: Any, bsz: int) -> Any:
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source: Any, i: int) -> tuple[Any, Any]:
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


def repackage_hidden(h: Any) -> Any:
    """Wraps hidden states in new tensors, to detach them from their history."""
    import torch

    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def train_word_lm(out_dir: str, spec: OthersSpec) -> str:
    import torch
    from torch import nn

    torch.manual_seed(spec.seed)
    stream = torch.from_numpy(markov_text(VOCAB, 48_000))
    train_data, val_data = batchify(stream[:40_000], BATCH), batchify(stream[40_000:], EVAL_BATCH)
    RNNModel, TransformerModel = _models()
    transformer = spec.variant == "Transformer"
    if transformer:
        model = TransformerModel(VOCAB, 32, 2, 64, 2, 0.2)
    else:
        model = RNNModel(spec.variant, VOCAB, 32, 64, 1, 0.0)
    criterion = nn.NLLLoss()
    if spec.freeze:
        freeze_all([model])
    capture = Capture(out_dir, spec)
    capture.start([model], [criterion])
    mask = nn.Transformer.generate_square_subsequent_mask(BPTT)
    eval_every = 50

    def evaluate() -> float:
        model.eval()
        total, count = 0.0, 0
        hidden = None if transformer else model.init_hidden(EVAL_BATCH)
        with torch.no_grad():
            for i in range(0, val_data.size(0) - 1, BPTT):
                data, targets = get_batch(val_data, i)
                if transformer:
                    output = model(data, mask[: len(data), : len(data)]).view(-1, VOCAB)
                else:
                    output, hidden = model(data, hidden)
                    hidden = repackage_hidden(hidden)
                total += len(data) * criterion(output, targets).item()
                count += len(data)
        return total / count

    lr, step = spec.lr, 0
    try:
        while step < spec.steps:
            model.train()
            hidden = None if transformer else model.init_hidden(BATCH)
            for i in range(0, train_data.size(0) - 1, BPTT):
                if step >= spec.steps:
                    break
                data, targets = get_batch(train_data, i)
                # Starting each batch, detach the hidden state from how it was produced;
                # otherwise the model would backpropagate all the way to the start of the data.
                model.zero_grad()
                if transformer:
                    output = model(data, mask[: len(data), : len(data)]).view(-1, VOCAB)
                else:
                    hidden = repackage_hidden(hidden)
                    output, hidden = model(data, hidden)
                loss = criterion(output, targets)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
                for p in model.parameters():
                    if p.grad is not None:
                        p.data.add_(p.grad, alpha=-lr)
                capture.losses.append(float(loss.item()))
                step += 1
                if step % eval_every == 0:
                    capture.val_losses.append((step, evaluate()))
                    model.train()
    finally:
        capture.extra["perplexity"] = math.exp(min(50.0, capture.val_losses[-1][1])) if capture.val_losses else None
        out = capture.finish()
    return out
