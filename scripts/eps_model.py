#!/usr/bin/python3
"""Reads an eps model export (docs/model-format.md) with numpy alone.

    python3 scripts/eps_model.py DIR          # what the export holds, one line per parameter

As a module (scripts/ on sys.path):

    from eps_model import EpsModel
    model = EpsModel("DIR")
    model.manifest["model"]                   # the model's type and sizes
    ids, weights = model.table("dlrm.emb")    # uint64 [n], float32 [n, dim]
    top = model.dense("dlrm.top.0")           # float32 [size]
    rows = model.rows("dlrm.emb", ids)        # float32 [len(ids), dim]; ids the export
                                              # lacks read as the initializer makes them
    model.feature_id(field, "raw value")      # eps's id of a categorical value (needs
                                              # python3-xxhash)

Arrays are memory-mapped where they can be (np.load(mmap_mode="r")), so reading the
manifest and one table of a model larger than memory works.
"""

import json
import os
import sys

import numpy as np

FORMAT = "eps-model"
VERSION = 1
# core/hashing.cc: the seed of field f is this plus f.
FEATURE_SEED_BASE = 0x6570735F66656174
# The dense-chunk key: the table id above these bits (cluster/placement.h).
DENSE_CHUNK_BITS = 40

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_MIX1 = _U64(0xBF58476D1CE4E5B9)
_MIX2 = _U64(0x94D049BB133111EB)


class ExportError(Exception):
    """An export that is missing, unfinished or of another format."""


def _mix64(x):
    """core/hashing.h Mix64 (splitmix64's finaliser) on uint64 arrays."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> _U64(30))
        x = x * _MIX1
        x = x ^ (x >> _U64(27))
        x = x * _MIX2
        return x ^ (x >> _U64(31))


def _hash3(a, b, c):
    """core/hashing.h Hash3, element-wise over broadcast uint64 arrays."""
    with np.errstate(over="ignore"):
        return _mix64(_mix64(_mix64(np.asarray(a, _U64) + _GOLDEN) ^ np.asarray(b, _U64))
                      ^ np.asarray(c, _U64))


def _unit(h):
    """core/hashing.h ToUnitInterval: a hash to a float64 in [0, 1)."""
    return (h >> _U64(11)).astype(np.float64) * 2.0 ** -53


def initial_rows(initializer, seed, table_id, keys, dim):
    """The rows a server makes for `keys` (cluster/initializer.cc): float32 [len(keys), dim].

    initializer: a TableSpec's "initializer" ({"kind": "ZEROS"|"NORMAL"|"UNIFORM", "scale"})."""
    keys = np.asarray(keys, dtype=_U64)
    kind = initializer.get("kind", "ZEROS")
    # The server computes in double from the float it holds.
    scale = float(np.float32(initializer.get("scale", 0.0)))
    if kind == "ZEROS" or len(keys) == 0:
        return np.zeros((len(keys), dim), dtype=np.float32)
    row_hash = _hash3(_U64(seed), _U64(table_id), keys)[:, None]  # [n, 1]
    element = np.arange(dim, dtype=_U64)[None, :]  # [1, dim]
    if kind == "UNIFORM":
        u = _unit(_hash3(row_hash, element, _U64(0)))
        return (scale * (2.0 * u - 1.0)).astype(np.float32)
    if kind != "NORMAL":
        raise ExportError(f"unknown initializer kind {kind!r}")
    # A standard normal truncated at 2, by Box-Muller: attempt k uses the counters 2k, 2k+1.
    z = np.zeros((len(keys), dim))
    pending = np.ones((len(keys), dim), dtype=bool)
    for attempt in range(64):
        u1 = 1.0 - _unit(_hash3(row_hash, element, _U64(2 * attempt)))
        u2 = _unit(_hash3(row_hash, element, _U64(2 * attempt + 1)))
        draw = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
        take = pending & (np.abs(draw) <= 2.0)
        z[take] = draw[take]
        pending &= ~take
        if not pending.any():
            break
    return (scale * z).astype(np.float32)


class EpsModel:
    """A model export: its manifest, and its parameters read on demand."""

    def __init__(self, directory):
        self.directory = directory
        path = os.path.join(directory, "manifest.json")
        if not os.path.exists(path):
            raise ExportError(f"no {path}: not a model export, or one that did not finish")
        with open(path) as f:
            self.manifest = json.load(f)
        if self.manifest.get("format") != FORMAT:
            raise ExportError(f"{path} is not the manifest of an eps model export")
        if not 1 <= self.manifest.get("version", 0) <= VERSION:
            raise ExportError(f"{path} is format version {self.manifest.get('version')}; "
                              f"this reader reads version {VERSION}")
        self.params = {p["name"]: p for p in self.manifest["params"]}
        self.seed = int(self.manifest["job"]["seed"])
        self._tables = {}

    def _param(self, name, kind):
        if name not in self.params:
            raise KeyError(f"the export has no parameter {name!r} "
                           f"(it has {', '.join(self.params)})")
        param = self.params[name]
        if param["kind"] != kind:
            raise KeyError(f"{name!r} is {param['kind']}, not {kind}")
        return param

    def _parts(self, param):
        """(keys, rows) of every part, memory-mapped."""
        for stem in param["parts"]:
            base = os.path.join(self.directory, stem)
            keys = np.load(base + ".keys.npy", mmap_mode="r")
            rows = np.load(base + ".rows.npy", mmap_mode="r")
            if rows.ndim != 2 or len(rows) != len(keys) or rows.shape[1] < param["dim"]:
                raise ExportError(f"{base}.{{keys,rows}}.npy do not fit {param['name']} "
                                  f"(dim {param['dim']})")
            yield keys, rows

    def table(self, name, with_state=False):
        """An embedding table: ids uint64 [n], weights float32 [n, dim] (and the optimizer
        state float32 [n, row_floats - dim] with with_state)."""
        param = self._param(name, "embedding")
        dim = param["dim"]
        ids, weights, state = [], [], []
        for keys, rows in self._parts(param):
            ids.append(np.asarray(keys))
            weights.append(np.asarray(rows[:, :dim]))
            if with_state:
                state.append(np.asarray(rows[:, dim:]))
        ids = np.concatenate(ids) if ids else np.zeros(0, _U64)
        weights = np.concatenate(weights) if weights else np.zeros((0, dim), np.float32)
        if with_state:
            return ids, weights, np.concatenate(state)
        return ids, weights

    def dense(self, name):
        """A dense tensor, float32 [size]; chunks no part holds read as initialised."""
        param = self._param(name, "dense")
        dim, size = param["dim"], param["size"]
        chunks = (size + dim - 1) // dim
        padded = np.zeros(chunks * dim, dtype=np.float32)
        seen = np.zeros(chunks, dtype=bool)
        for keys, rows in self._parts(param):
            keys = np.asarray(keys).astype(np.int64)
            if len(keys) and keys.max() >= chunks:
                raise ExportError(f"{name}: chunk {keys.max()} of {chunks}")
            padded.reshape(chunks, dim)[keys] = rows[:, :dim]
            seen[keys] = True
        missing = np.nonzero(~seen)[0]
        if len(missing):
            spec = param["spec"]
            table_id = int(spec.get("id", 0))
            chunk_keys = (np.uint64(table_id) << np.uint64(DENSE_CHUNK_BITS)) | missing.astype(_U64)
            padded.reshape(chunks, dim)[missing] = initial_rows(
                spec.get("initializer", {}), self.seed, table_id, chunk_keys, dim)
        return padded[:size]

    def rows(self, name, ids):
        """The weights of `ids` in embedding table `name`, float32 [len(ids), dim]: an id
        the export lacks reads as the table's initializer makes it, as on a server."""
        param = self._param(name, "embedding")
        if name not in self._tables:
            table_ids, weights = self.table(name)
            order = np.argsort(table_ids)
            self._tables[name] = (table_ids[order], weights[order])
        table_ids, weights = self._tables[name]
        ids = np.asarray(ids, dtype=_U64)
        at = np.searchsorted(table_ids, ids)
        at_clipped = np.minimum(at, max(len(table_ids) - 1, 0))
        found = (at < len(table_ids)) & (table_ids[at_clipped] == ids) if len(table_ids) else \
            np.zeros(len(ids), dtype=bool)
        out = np.empty((len(ids), param["dim"]), dtype=np.float32)
        out[found] = weights[at_clipped[found]]
        if (~found).any():
            spec = param["spec"]
            out[~found] = initial_rows(spec.get("initializer", {}), self.seed,
                                       int(spec.get("id", 0)), ids[~found], param["dim"])
        self.unseen = int((~found).sum())
        return out

    @staticmethod
    def feature_id(field, value):
        """eps's feature id of raw categorical `value` (str or bytes) in field `field`."""
        import xxhash  # python3-xxhash

        data = value.encode() if isinstance(value, str) else value
        return xxhash.xxh3_64_intdigest(data, seed=FEATURE_SEED_BASE + field)


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0] + "\n\nusage: eps_model.py DIR", file=sys.stderr)
        return 2
    try:
        model = EpsModel(argv[1])
    except (ExportError, OSError, ValueError) as e:
        print(f"eps_model.py: {e}", file=sys.stderr)
        return 1
    m = model.manifest
    print(f"{m['model']['type']} model of job {m['job']['name']} ({m['job']['job_id']}), "
          f"{m['job']['records_trained']} records trained")
    if m.get("eval"):
        print(f"eval: AUC {m['eval']['auc']:.6f}, log loss {m['eval']['log_loss']:.6f} "
              f"over {m['eval']['records']} records")
    for name, param in model.params.items():
        if param["kind"] == "dense":
            print(f"  {name}: dense, {param['size']} floats")
        else:
            rows = sum(len(keys) for keys, _ in model._parts(param))
            print(f"  {name}: embedding, {rows} rows of {param['dim']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
