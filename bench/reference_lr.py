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
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch

NUM_DENSE = 13
NUM_CAT = 26


def expand(spec):
    files = []
    for entry in spec.split(","):
        entry = entry.strip()
        if os.path.isdir(entry):
            files += [os.path.join(entry, f) for f in sorted(os.listdir(entry))
                      if not f.startswith(".") and os.path.isfile(os.path.join(entry, f))]
        elif os.path.isfile(entry):
            files.append(entry)
        else:
            matched = sorted(glob.glob(entry))
            if not matched:
                sys.exit(f"reference_lr.py: no such file or directory: {entry}")
            files += matched
    return sorted(set(files))


def load(files, vocab, grow):
    """Parses files into (labels, dense, ids); grows `vocab` when `grow`."""
    labels, dense, ids = [], [], []
    unknown = 0  # index 0: ids never seen in training (weight stays 0)
    malformed = 0
    for path in files:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            for line in f:
                cols = line.rstrip("\r\n").split("\t")
                if len(cols) != 1 + NUM_DENSE + NUM_CAT:
                    malformed += 1
                    continue
                try:
                    y = float(cols[0])
                    xs = [float(c) if c else 0.0 for c in cols[1:1 + NUM_DENSE]]
                except ValueError:
                    malformed += 1
                    continue
                if not 0.0 <= y <= 1.0:
                    malformed += 1
                    continue
                row = []
                for f_index, value in enumerate(cols[1 + NUM_DENSE:]):
                    key = (f_index, value)
                    index = vocab.get(key)
                    if index is None:
                        if grow:
                            index = len(vocab) + 1
                            vocab[key] = index
                        else:
                            index = unknown
                    row.append(index)
                labels.append(y)
                dense.append([math.log1p(x) if x > 0 else 0.0 for x in xs])
                ids.append(row)
    return (np.asarray(labels, dtype=np.float32), np.asarray(dense, dtype=np.float32),
            np.asarray(ids, dtype=np.int64), malformed)


def auc(predictions, labels):
    order = np.argsort(predictions, kind="mergesort")
    p = predictions[order]
    y = labels[order] >= 0.5
    # Tie-averaged ranks.
    ranks = np.empty(len(p), dtype=np.float64)
    i = 0
    n = len(p)
    while i < n:
        j = i
        while j < n and p[j] == p[i]:
            j += 1
        ranks[i:j] = (i + 1 + j) / 2.0
        i = j
    positives = y.sum()
    negatives = n - positives
    if positives == 0 or negatives == 0:
        return 0.5
    return (ranks[y].sum() - positives * (positives + 1) / 2) / (positives * negatives)


def logloss(predictions, labels):
    p = np.clip(predictions.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


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
