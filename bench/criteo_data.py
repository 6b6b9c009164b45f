"""Criteo-format loading and evaluation metrics shared by the PyTorch references.

Used by bench/reference_lr.py and bench/reference_models.py (both run under
Debian's /usr/bin/python3 with python3-numpy):

  expand(spec)               comma-separated files, directories (their visible
                             files) or globs -> sorted list of files
  load(files, vocab, grow)   -> (labels, dense, ids, malformed): exact
                             (field, value) ids (an empty value is its field's
                             own id, as in eps), log(1 + x) for positive
                             integer features; ids missing from `vocab` are
                             added when `grow`, else mapped to index 0
  auc(predictions, labels)   tie-averaged rank AUC
  logloss(predictions, labels)  mean log loss, p clipped to [1e-7, 1 - 1e-7]
"""

import glob
import math
import os
import sys

import numpy as np

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
                sys.exit(f"{os.path.basename(sys.argv[0])}: no such file or directory: {entry}")
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
