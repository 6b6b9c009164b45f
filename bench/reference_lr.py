#!/usr/bin/python3
"""A careful single-machine logistic regression in PyTorch, the yardstick for eps's LR.

Reads Criteo-format files (label, 13 integer, 26 categorical tab-separated
columns, empty fields allowed), one weight per exact (field, value) id (an
empty value is its field's own id, as in eps), log(1 + x) for positive
integer features, sparse Adagrad on the ids and Adagrad on the dense
weights, one pass in file order, batch 1024. Ids first seen in the eval data
keep weight 0. With several --lr values it reports each and the best.

  /usr/bin/python3 bench/reference_lr.py --train DIR_OR_FILES --eval DIR_OR_FILES \
      [--lr 0.02,0.05,0.1] [--batch 1024] [--epochs 1] [--threads N]

Prints one JSON line per learning rate and a final {"best": ...} line.
Needs Debian's python3-torch and python3-numpy (/usr/bin/python3).
"""

import argparse
import json
import sys
import time

import torch

from criteo_data import NUM_DENSE, auc, expand, load, logloss

class Lr(torch.nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.w = torch.nn.Embedding(vocab_size + 1, 1, sparse=True)
        torch.nn.init.zeros_(self.w.weight)
        self.dense = torch.nn.Linear(NUM_DENSE, 1)
        torch.nn.init.zeros_(self.dense.weight)
        torch.nn.init.zeros_(self.dense.bias)

    def forward(self, dense, ids):
        return self.w(ids).sum(dim=(1, 2)) + self.dense(dense).squeeze(1)


def train_and_eval(train, evaluation, vocab_size, lr, batch, epochs):
    torch.manual_seed(0)
    model = Lr(vocab_size)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=lr, eps=1e-8)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    y, x, ids, _ = train
    y_t, x_t, ids_t = torch.from_numpy(y), torch.from_numpy(x), torch.from_numpy(ids)
    for _ in range(epochs):
        for start in range(0, len(y), batch):
            end = start + batch
            optimizer.zero_grad()
            loss = loss_fn(model(x_t[start:end], ids_t[start:end]), y_t[start:end])
            loss.backward()
            optimizer.step()
    ey, ex, eids, _ = evaluation
    with torch.no_grad():
        predictions = torch.sigmoid(model(torch.from_numpy(ex), torch.from_numpy(eids))).numpy()
    return auc(predictions, ey), logloss(predictions, ey)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--eval", required=True)
    parser.add_argument("--lr", default="0.01,0.02,0.05,0.1,0.2")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    started = time.time()
    vocab = {}
    train = load(expand(args.train), vocab, grow=True)
    evaluation = load(expand(args.eval), vocab, grow=False)
    print(f"reference_lr.py: {len(train[0])} train rows, {len(evaluation[0])} eval rows, "
          f"{len(vocab)} ids, loaded in {time.time() - started:.1f} s", file=sys.stderr)
    best = None
    for lr in [float(v) for v in args.lr.split(",")]:
        a, ll = train_and_eval(train, evaluation, len(vocab), lr, args.batch, args.epochs)
        result = {"lr": lr, "eval_auc": a, "eval_logloss": ll}
        print(json.dumps(result), flush=True)
        if best is None or a > best["eval_auc"]:
            best = result
    print(json.dumps({"best": best}))


if __name__ == "__main__":
    main()
