#!/usr/bin/python3
"""PyTorch references of eps's models (lr, wdl, deepfm, dlrm), following docs/models.md exactly.

The parameter layout is the C++ models' own: every Linear is ONE flat tensor of
out*in + out floats (W row-major [out, in], then b), the D+1 linear weights are
v then c, embedding tables give one row per id, and the parameters come in the
model's parameter order under the server's table names (docs/models.md).

Subcommands:

  crosscheck DIR [--dtype float64|float32]
      Reads a batch and the model's parameters written by the C++ side (all
      little-endian): DIR/meta.json ({"model", "num_dense", "num_fields",
      "embedding_dim", "mlp", "bottom_mlp", "top_mlp", "activation", "batch",
      "num_keys", "params": [{"name", "kind": "embedding"|"dense", "size"}],
      optionally "pooling": "sum" (the default) or "mean"), labels.f32 [n],
      dense.f32 [n*D], slots.u32 [n*F] (rows of the K gathered embedding rows)
      and param_<i>.f32 (an embedding param: K*size floats, a [K, size]
      buffer; a dense param: size floats). A multi-value batch adds
      offsets.u32 [n*F+1] (0 first, rising by at least 1 per field): example
      i's field f has the ids of slots[offsets[i*F+f] .. offsets[i*F+f+1]),
      slots.u32 then holding offsets[n*F] entries, and every field is read
      through its pooled row (docs/models.md). Runs forward and the
      backward of the batch's MEAN log loss in --dtype (default float64) and
      writes DIR/torch_predictions.f32 [n] (sigmoid of the logits),
      DIR/torch_loss.json {"loss_sum": SUM OF THE LOG LOSS} and
      DIR/torch_grad_<i>.f32 (same layout as param_<i>.f32), all float32.
      A bad meta.json or input file: one line on stderr, exit status 2.

  train --model M --train PATHS --eval PATHS [--lr 0.05] [--batch 1024]
        [--mlp-optimizer adam] [--mlp-lr 0.001]
        [--epochs 1] [--threads 1] [--embedding-dim 16] [--mlp 400,400,400,1]
        [--bottom-mlp 512,256,64,16] [--top-mlp 512,256,1] [--activation relu]
        [--init-scale 0.05] [--initial-accumulator 0] [--epsilon 1e-8] [--seed 1]
      Trains single-process on Criteo-format files (bench/criteo_data.py:
      exact (field, value) ids, log(1 + x) for positive integer features), one
      pass per epoch in file order, with the data loaded before the loop, the
      way a PyTorch user trains: sparse Adagrad at --lr on the embedding
      tables (g = gradient of the batch's mean loss; acc += g*g;
      w -= lr * g / (sqrt(acc) + eps), torch.optim.Adagrad's rule; acc starts
      at --initial-accumulator, whose default, like --epsilon's, is eps's own
      optimizer default from core/job_config.h; only the batch's rows and
      their accumulators change), dense Adagrad at --lr on the linear weights
      of the integer features, and torch.optim.Adam at --mlp-lr on the MLP
      layers (--mlp-optimizer adagrad: Adagrad at --mlp-lr instead), eps's
      defaults (docs/models.md, Optimizers). Ids first seen in the eval data
      get a freshly initialised row that is never trained. Prints one JSON
      line {"model", "auc", "logloss", "train_seconds", "samples_per_s",
      "lr", "mlp_optimizer", "mlp_lr"}.

  speed --model M [--batch 1024] [--threads 1] [--seconds 5] [--num-keys K]
        [model size flags as for train]
      Times forward + backward (of the mean loss, no optimizer step) on one
      random batch of the Criteo shape (D = 13, F = 26; K unique rows, default
      batch*F/2, slots uniform in [0, K)), the rows given as [K, dim] leaf
      tensors gathered with the slots, as in crosscheck (the C++ model's work).
      Prints one JSON line {"model", "batch", "threads", "samples_per_s"}.

  predict --model-dir DIR --data PATHS [--out FILE] [--batch 1024] [--threads 1]
      Rebuilds the model of an eps model export (docs/model-format.md, read with
      scripts/eps_model.py) in PyTorch and scores Criteo-format files with it in
      float32, the records in file order, eps's feature ids (XXH3, needs
      python3-xxhash) and its dense transform; ids the export lacks read as the
      servers' initializer makes them. Writes one prediction per line to --out
      and prints one JSON line {"records", "auc", "logloss", "unseen_ids"}.

PATHS: comma-separated files, directories or globs. Needs Debian's
python3-torch and python3-numpy (/usr/bin/python3); libopenblas0-pthread makes
the CPU matmuls fast.
"""

import argparse
import ctypes
import json
import math
import os
import sys
import time

# Before torch loads libgomp: OpenMP workers that spin after each parallel
# region steal the cores OpenBLAS's own thread pool needs for the matmuls
# (measured on 2 cores: wdl 18k samples/s with 2 threads spinning, 51k
# passive, 31k with 1 thread). An explicit OMP_WAIT_POLICY wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as nnf

from criteo_data import NUM_CAT, NUM_DENSE, auc, expand, load, logloss

PROG = "reference_models.py"
MODELS = ("lr", "wdl", "deepfm", "dlrm")
ACTIVATIONS = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}

# Defaults of docs/models.md (model.*) and core/job_config.h (optimizer.*).
DEFAULT_EMBEDDING_DIM = 16
DEFAULT_MLP = (400, 400, 400, 1)
DEFAULT_BOTTOM_MLP = (512, 256, 64, 16)
DEFAULT_TOP_MLP = (512, 256, 1)
DEFAULT_INIT_SCALE = 0.05
DEFAULT_INITIAL_ACCUMULATOR = 0.0  # optimizer.initial_accumulator in core/job_config.h
DEFAULT_EPSILON = 1e-8  # optimizer.epsilon in core/job_config.h


class SpecError(ValueError):
    """A model configuration (or crosscheck input) that does not make sense."""


class Param:
    """One parameter of the model, in the model's parameter order.

    kind "embedding": a table with `size` floats per row (the model sees the
    batch's [K, size] rows). kind "dense": one flat tensor of `size` floats;
    `linear` is (in, out) for a Linear (W [out, in] row-major, then b), None
    for the D+1 weights (v, then c) of lr / wide / first.
    """

    def __init__(self, name, kind, size, linear=None):
        self.name, self.kind, self.size, self.linear = name, kind, size, linear
        # An MLP layer (eps's ParamSpec::mlp_layer): optimizer.mlp trains it.
        self.mlp = linear is not None


class ModelSpec:
    """The model's configuration and its parameter list (docs/models.md)."""

    def __init__(self, model, num_dense, num_fields, embedding_dim=DEFAULT_EMBEDDING_DIM,
                 mlp=DEFAULT_MLP, bottom_mlp=DEFAULT_BOTTOM_MLP, top_mlp=DEFAULT_TOP_MLP,
                 activation="relu"):
        if model not in MODELS:
            raise SpecError(f"unknown model {model!r} (expected one of {', '.join(MODELS)})")
        if activation not in ACTIVATIONS:
            raise SpecError(f"unknown activation {activation!r} (expected relu, sigmoid or tanh)")
        for what, value in (("num_dense", num_dense), ("num_fields", num_fields),
                            ("embedding_dim", embedding_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpecError(f"{what} must be a positive integer, got {value!r}")
        for what, sizes in (("mlp", mlp), ("bottom_mlp", bottom_mlp), ("top_mlp", top_mlp)):
            if (not isinstance(sizes, (list, tuple)) or not sizes
                    or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in sizes)):
                raise SpecError(f"{what} must be a non-empty list of positive integers, "
                                f"got {sizes!r}")
        if model in ("wdl", "deepfm") and mlp[-1] != 1:
            raise SpecError(f"mlp's last size must be 1, got {list(mlp)}")
        if model == "dlrm" and bottom_mlp[-1] != embedding_dim:
            raise SpecError(f"bottom_mlp's last size must equal embedding_dim "
                            f"{embedding_dim}, got {list(bottom_mlp)}")
        if model == "dlrm" and top_mlp[-1] != 1:
            raise SpecError(f"top_mlp's last size must be 1, got {list(top_mlp)}")
        self.model = model
        self.num_dense = num_dense  # D
        self.num_fields = num_fields  # F
        self.embedding_dim = embedding_dim  # d
        self.mlp = tuple(mlp)
        self.bottom_mlp = tuple(bottom_mlp)
        self.top_mlp = tuple(top_mlp)
        self.activation = activation
        self.params = self._layout()

    def _mlp_params(self, prefix, in_size, sizes):
        params = []
        for i, out in enumerate(sizes):
            params.append(Param(f"{prefix}.{i}", "dense", out * in_size + out, (in_size, out)))
            in_size = out
        return params

    def _layout(self):
        """The parameters in the model's order, with the server's table names."""
        D, F, d, m = self.num_dense, self.num_fields, self.embedding_dim, self.model
        if m == "lr":
            return [Param("lr.w", "embedding", 1), Param("lr.dense", "dense", D + 1)]
        if m in ("wdl", "deepfm"):
            wide, wide_dense = ("wdl.wide", "wdl.wide_dense") if m == "wdl" else \
                ("deepfm.first", "deepfm.first_dense")
            return ([Param(wide, "embedding", 1), Param(f"{m}.emb", "embedding", d),
                     Param(wide_dense, "dense", D + 1)]
                    + self._mlp_params(f"{m}.mlp", D + F * d, self.mlp))
        # dlrm
        num_dots = (F + 1) * F // 2
        return ([Param("dlrm.emb", "embedding", d)]
                + self._mlp_params("dlrm.bottom", D, self.bottom_mlp)
                + self._mlp_params("dlrm.top", d + num_dots, self.top_mlp))


# ----------------------------------------------------------------------------
# The math (docs/models.md). `values` maps every parameter name to a tensor:
# embedding params to the [K, dim] rows the slots index, dense params to their
# flat tensor. x: [n, D] dense features; slots: [n, F] int64 rows in [0, K),
# or, for a multi-value batch, a MultiValueFields in their place.
# ----------------------------------------------------------------------------


class MultiValueFields:
    """The categorical input of a multi-value batch: example i's field f has the rows
    slots[offsets[i*F+f] .. offsets[i*F+f+1]) (at least one), read through their
    pooled row, the sum or the mean of those rows (docs/models.md).

    slots: [S] int64; offsets: [n*F+1] int64; pooling: "sum" or "mean"."""

    def __init__(self, slots, offsets, num_fields, pooling):
        self.n = (offsets.numel() - 1) // num_fields
        self.num_fields = num_fields
        self.slots = slots
        self.pooling = pooling
        self.counts = offsets[1:] - offsets[:-1]  # ids of (example, field) i*F + f
        # The (example, field) of every slot: where its row is added.
        self.segment = torch.repeat_interleave(torch.arange(self.counts.numel()), self.counts)

    def rows(self, table):
        """[n, F, dim]: every field's pooled row of `table` ([K, dim])."""
        gathered = table.index_select(0, self.slots)  # [S, dim]
        pooled = torch.zeros(self.counts.numel(), table.shape[1], dtype=table.dtype).index_add(
            0, self.segment, gathered)
        if self.pooling == "mean":
            pooled = pooled / self.counts.unsqueeze(1).to(table.dtype)
        return pooled.view(self.n, self.num_fields, table.shape[1])


def field_rows(table, slots):
    """[n, F, dim]: example i's field f's row of `table` ([K, dim]), pooled for a
    multi-value batch."""
    if isinstance(slots, MultiValueFields):
        return slots.rows(table)
    return nnf.embedding(slots, table)


def linear(h, p, in_size, out):
    """Linear(in, out) on a flat tensor p = W ([out, in] row-major) then b: h W^T + b."""
    w = p[:out * in_size].view(out, in_size)
    b = p[out * in_size:]
    return torch.addmm(b, h, w.t())


def mlp(h, values, prefix, in_size, sizes, act, act_after_last):
    """MLP(in; sizes): the activation after every layer but the last (also the last
    when act_after_last, as dlrm's bottom MLP)."""
    for i, out in enumerate(sizes):
        h = linear(h, values[f"{prefix}.{i}"], in_size, out)
        if i + 1 < len(sizes) or act_after_last:
            h = act(h)
        in_size = out
    return h


def first_order(w_rows, vc, x, slots):
    """lr / wide / first: sum_f w[i,f] + x.v + c, from the dim-1 rows and the D+1 weights."""
    D = x.shape[1]
    w = field_rows(w_rows, slots).sum(dim=(1, 2))  # [n, F, 1] -> [n]
    return w + torch.mv(x, vc[:D]) + vc[D]


def forward(spec, values, x, slots):
    """The logits [n] of the batch. `slots`: [n, F] rows, or a MultiValueFields."""
    m, F, d, D = spec.model, spec.num_fields, spec.embedding_dim, spec.num_dense
    act = ACTIVATIONS[spec.activation]
    n = x.shape[0]
    if m == "lr":
        return first_order(values["lr.w"], values["lr.dense"], x, slots)
    if m in ("wdl", "deepfm"):
        wide, wide_dense = ("wdl.wide", "wdl.wide_dense") if m == "wdl" else \
            ("deepfm.first", "deepfm.first_dense")
        e = field_rows(values[f"{m}.emb"], slots)  # [n, F, d]
        deep_in = torch.cat([x, e.reshape(n, F * d)], dim=1)  # concat(x, e[i,1], ..., e[i,F])
        deep = mlp(deep_in, values, f"{m}.mlp", D + F * d, spec.mlp, act, False).squeeze(1)
        logit = first_order(values[wide], values[wide_dense], x, slots) + deep
        if m == "deepfm":
            # fm = 1/2 sum_k [ (sum_f e[i,f,k])^2 - sum_f e[i,f,k]^2 ]
            s = e.sum(dim=1)
            logit = logit + 0.5 * (s * s - (e * e).sum(dim=1)).sum(dim=1)
        return logit
    # dlrm: bottom MLP with the activation after every layer, the last included.
    z = mlp(x, values, "dlrm.bottom", D, spec.bottom_mlp, act, True)  # [n, d]
    e = field_rows(values["dlrm.emb"], slots)  # [n, F, d]
    t = torch.cat([z.unsqueeze(1), e], dim=1)  # T = [z, e1..eF]: [n, F+1, d]
    gram = torch.bmm(t, t.transpose(1, 2))  # [n, F+1, F+1]
    a, b = dlrm_pairs(F, x.device)
    dots = gram[:, a, b]  # T_a . T_b for a = 1..F (outer), b = 0..a-1 (inner)
    top_in = torch.cat([z, dots], dim=1)
    return mlp(top_in, values, "dlrm.top", d + F * (F + 1) // 2, spec.top_mlp, act,
               False).squeeze(1)


_PAIRS = {}


def dlrm_pairs(num_fields, device):
    """(a, b) index vectors of the strict lower triangle of the (F+1)x(F+1) Gram
    matrix, row by row: (1,0), (2,0), (2,1), (3,0), ... -- the dot order of dlrm."""
    key = (num_fields, str(device))
    if key not in _PAIRS:
        a = [i for i in range(1, num_fields + 1) for _ in range(i)]
        b = [j for i in range(1, num_fields + 1) for j in range(i)]
        _PAIRS[key] = (torch.tensor(a, dtype=torch.long, device=device),
                       torch.tensor(b, dtype=torch.long, device=device))
    return _PAIRS[key]


def log_loss(logit, y):
    """Per-example -(y log p + (1-y) log(1-p)), p = sigmoid(logit), in the stable
    form softplus(logit) - y*logit. softplus(l) = logaddexp(0, l): exact for every
    logit (unlike torch's thresholded softplus) and its autograd derivative is
    sigmoid(l) everywhere -- relu(l) + log1p(exp(-|l|)) would give 0 instead of
    1/2 at l = 0, which is every logit of a zero-initialised lr."""
    return torch.logaddexp(torch.zeros_like(logit), logit) - y * logit


def init_param(p, spec, shape_rows, init_scale, dtype, generator=None):
    """A fresh parameter: embedding [rows, dim] (dim d: uniform(+-init_scale), dim 1:
    zeros); D+1 weights zeros; Linear W and b uniform(+-1/sqrt(in))."""
    if p.kind == "embedding":
        if p.size == 1:
            return torch.zeros(shape_rows, 1, dtype=dtype)
        t = torch.empty(shape_rows, p.size, dtype=dtype)
        return t.uniform_(-init_scale, init_scale, generator=generator)
    if p.linear is None:
        return torch.zeros(p.size, dtype=dtype)
    bound = 1.0 / math.sqrt(p.linear[0])
    return torch.empty(p.size, dtype=dtype).uniform_(-bound, bound, generator=generator)


def set_threads(threads):
    """N threads for torch's OpenMP ops and for the BLAS (Debian's torch calls the
    system BLAS, libopenblas0-pthread, which has its own pool, sized to every core
    unless told otherwise)."""
    torch.set_num_threads(threads)
    for name in ("libopenblas.so.0", "libopenblasp.so.0"):
        try:
            ctypes.CDLL(name).openblas_set_num_threads(threads)
            return
        except (OSError, AttributeError):
            continue


def parse_sizes(text):
    try:
        sizes = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of sizes: {text!r}")
    return sizes


def spec_from_args(args, parser):
    try:
        return ModelSpec(args.model, NUM_DENSE, NUM_CAT, args.embedding_dim, args.mlp,
                         args.bottom_mlp, args.top_mlp, args.activation)
    except SpecError as e:
        parser.error(str(e))


# ----------------------------------------------------------------------------
# crosscheck
# ----------------------------------------------------------------------------

def read_crosscheck(directory):
    """(spec, n, K, labels, dense, slots, offsets, pooling, param buffers as float32
    numpy) from DIR: slots [n, F] and offsets None for a single-value batch, slots
    [offsets[-1]] and offsets [n*F+1] (int64) for a multi-value one. Raises
    SpecError on anything malformed."""
    path = os.path.join(directory, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read {path}: {e}")
    if not isinstance(meta, dict):
        raise SpecError(f"{path} is not a JSON object")

    def need(key):
        if key not in meta:
            raise SpecError(f"meta.json has no {key!r}")
        return meta[key]

    model = need("model")
    kwargs = {}
    if model in ("wdl", "deepfm", "dlrm"):
        kwargs["embedding_dim"] = need("embedding_dim")
        kwargs["activation"] = need("activation")
    if model in ("wdl", "deepfm"):
        kwargs["mlp"] = need("mlp")
    if model == "dlrm":
        kwargs["bottom_mlp"] = need("bottom_mlp")
        kwargs["top_mlp"] = need("top_mlp")
    spec = ModelSpec(model, need("num_dense"), need("num_fields"), **kwargs)
    pooling = meta.get("pooling", "sum")
    if pooling not in ("sum", "mean"):
        raise SpecError(f"unknown pooling {pooling!r} (expected sum or mean)")
    n, K = need("batch"), need("num_keys")
    for what, value in (("batch", n), ("num_keys", K)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpecError(f"{what} must be a positive integer, got {value!r}")
    params = need("params")
    if not isinstance(params, list):
        raise SpecError("meta.json's params is not a list")
    expected = [(p.name, p.kind, p.size) for p in spec.params]
    got = []
    for p in params:
        if not isinstance(p, dict):
            raise SpecError(f"meta.json's params holds a non-object: {p!r}")
        got.append((p.get("name"), p.get("kind"), p.get("size")))
    if got != expected:
        raise SpecError(f"params {got} do not match the {model} model's {expected} "
                        f"(docs/models.md)")

    D, F = spec.num_dense, spec.num_fields

    def read(name, dtype, count):
        file = os.path.join(directory, name)
        try:
            data = np.fromfile(file, dtype=dtype)
        except OSError as e:
            raise SpecError(f"cannot read {file}: {e}")
        if data.size != count:
            raise SpecError(f"{file} holds {data.size} values, expected {count}")
        return data

    labels = read("labels.f32", "<f4", n)
    dense = read("dense.f32", "<f4", n * D).reshape(n, D)
    offsets = None
    if os.path.exists(os.path.join(directory, "offsets.u32")):
        offsets = read("offsets.u32", "<u4", n * F + 1).astype(np.int64)
        if offsets[0] != 0 or np.any(offsets[1:] <= offsets[:-1]):
            raise SpecError("offsets.u32 must start at 0 and rise by at least 1 per field")
        slots = read("slots.u32", "<u4", int(offsets[-1]))
    else:
        slots = read("slots.u32", "<u4", n * F).reshape(n, F)
    if slots.size and int(slots.max()) >= K:
        raise SpecError(f"slots.u32 holds {int(slots.max())}, not below num_keys {K}")
    buffers = [read(f"param_{i}.f32", "<f4", K * p.size if p.kind == "embedding" else p.size)
               for i, p in enumerate(spec.params)]
    return spec, n, K, labels, dense, slots, offsets, pooling, buffers


def crosscheck(args):
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    try:
        spec, n, K, labels, dense, slots, offsets, pooling, buffers = read_crosscheck(args.dir)
    except SpecError as e:
        print(f"{PROG} crosscheck: {e}", file=sys.stderr)
        return 2
    y = torch.from_numpy(labels.astype(np.float64)).to(dtype)
    x = torch.from_numpy(dense.astype(np.float64)).to(dtype)
    slot_t = torch.from_numpy(slots.astype(np.int64))
    if offsets is not None:
        slot_t = MultiValueFields(slot_t, torch.from_numpy(offsets), spec.num_fields, pooling)
    values = {}
    for p, buf in zip(spec.params, buffers):
        t = torch.from_numpy(buf.astype(np.float64)).to(dtype)
        if p.kind == "embedding":
            t = t.view(K, p.size)  # the batch's rows: gathered with slots, grad = per-row sum
        values[p.name] = t.requires_grad_()
    logit = forward(spec, values, x, slot_t)
    losses = log_loss(logit, y)
    loss_sum = losses.sum()
    (loss_sum / n).backward()  # gradients of the MEAN loss

    def write(name, tensor):
        tensor.detach().to(torch.float32).numpy().astype("<f4").tofile(
            os.path.join(args.dir, name))

    write("torch_predictions.f32", torch.sigmoid(logit))
    with open(os.path.join(args.dir, "torch_loss.json"), "w") as f:
        json.dump({"loss_sum": float(loss_sum)}, f)
        f.write("\n")
    for i, p in enumerate(spec.params):
        grad = values[p.name].grad
        if grad is None:
            grad = torch.zeros_like(values[p.name])
        write(f"torch_grad_{i}.f32", grad.reshape(-1))
    return 0


# ----------------------------------------------------------------------------
# train
# ----------------------------------------------------------------------------

def adagrad_(w, acc, g, lr, eps):
    """eps's Adagrad (ps/optimizer.cc), in place: acc += g*g; w -= lr*g/(sqrt(acc)+eps)."""
    acc.addcmul_(g, g)
    w.addcdiv_(g, acc.sqrt().add_(eps), value=-lr)


def train(args, parser):
    spec = spec_from_args(args, parser)
    set_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.time()
    vocab = {}
    ty, tx, tids, _ = load(expand(args.train), vocab, grow=True)
    train_ids = len(vocab)
    # Eval-only ids get rows of their own (initialised, never trained), as eps's
    # servers create a row for any id a worker pulls.
    ey, ex, eids, _ = load(expand(args.eval), vocab, grow=True)
    if len(ty) == 0 or len(ey) == 0:
        sys.exit(f"{PROG} train: no train or no eval rows")
    print(f"{PROG}: {len(ty)} train rows, {len(ey)} eval rows, {train_ids} train ids, "
          f"{len(vocab) - train_ids} eval-only ids, loaded in {time.time() - started:.1f} s",
          file=sys.stderr)

    dtype = torch.float32
    rows = len(vocab) + 1  # index 0 unused (load never hands it out when growing)
    weights, accs = {}, {}
    for p in spec.params:
        weights[p.name] = init_param(p, spec, rows, args.init_scale, dtype)
        accs[p.name] = torch.full_like(weights[p.name], args.initial_accumulator)
    embedding = [p.name for p in spec.params if p.kind == "embedding"]
    dense_names = [p.name for p in spec.params if p.kind == "dense"]

    y_t, x_t, ids_t = torch.from_numpy(ty), torch.from_numpy(tx), torch.from_numpy(tids)
    lr, eps = args.lr, args.epsilon
    mlp_names = [p.name for p in spec.params if p.mlp]
    mlp_adam = None
    if args.mlp_optimizer == "adam" and mlp_names:
        # torch.optim.Adam's defaults (betas 0.9, 0.999; eps 1e-8) are eps's.
        mlp_adam = torch.optim.Adam([weights[name] for name in mlp_names], lr=args.mlp_lr, eps=eps)
    started = time.time()
    for _ in range(args.epochs):
        for start in range(0, len(ty), args.batch):
            end = start + args.batch
            ids = ids_t[start:end]
            # The batch's unique ids (keys) and each (example, field)'s row among them.
            keys, slots = torch.unique(ids, sorted=True, return_inverse=True)
            values = {}
            for name in embedding:
                values[name] = weights[name].index_select(0, keys).requires_grad_()
            for name in dense_names:
                values[name] = weights[name].detach().requires_grad_()
            loss = log_loss(forward(spec, values, x_t[start:end], slots), y_t[start:end]).mean()
            loss.backward()
            with torch.no_grad():
                for name in dense_names:
                    if name not in mlp_names:  # the linear weights: the tables' Adagrad
                        adagrad_(weights[name], accs[name], values[name].grad, lr, eps)
                    elif mlp_adam is not None:
                        weights[name].grad = values[name].grad
                    else:
                        adagrad_(weights[name], accs[name], values[name].grad, args.mlp_lr, eps)
                if mlp_adam is not None:
                    mlp_adam.step()
                for name in embedding:
                    # Sparse: only the batch's rows and their accumulators change.
                    w = values[name].detach()
                    acc = accs[name].index_select(0, keys)
                    adagrad_(w, acc, values[name].grad, lr, eps)
                    weights[name].index_copy_(0, keys, w)
                    accs[name].index_copy_(0, keys, acc)
    train_seconds = time.time() - started

    predictions = []
    ex_t, eids_t = torch.from_numpy(ex), torch.from_numpy(eids)
    with torch.no_grad():
        for start in range(0, len(ey), 16384):
            end = start + 16384
            # The full tables as the "rows", the ids as the slots: the same math.
            logit = forward(spec, weights, ex_t[start:end], eids_t[start:end])
            predictions.append(torch.sigmoid(logit))
    predictions = torch.cat(predictions).numpy()
    print(json.dumps({"model": spec.model, "auc": float(auc(predictions, ey)),
                      "logloss": logloss(predictions, ey),
                      "train_seconds": round(train_seconds, 3),
                      "samples_per_s": round(len(ty) * args.epochs / train_seconds, 1),
                      "lr": lr, "mlp_optimizer": args.mlp_optimizer,
                      "mlp_lr": args.mlp_lr}), flush=True)
    return 0


# ----------------------------------------------------------------------------
# speed
# ----------------------------------------------------------------------------

def speed(args, parser):
    spec = spec_from_args(args, parser)
    set_threads(args.threads)
    gen = torch.Generator().manual_seed(1)
    n, F, D = args.batch, spec.num_fields, spec.num_dense
    K = args.num_keys if args.num_keys else max(1, n * F // 2)
    if K < 1:
        parser.error("--num-keys must be positive")
    dtype = torch.float32
    x = torch.empty(n, D, dtype=dtype).uniform_(0.0, 5.0, generator=gen)  # like log1p counts
    y = (torch.rand(n, generator=gen) < 0.25).to(dtype)
    slots = torch.randint(0, K, (n, F), generator=gen)
    params = {}
    for p in spec.params:
        params[p.name] = init_param(p, spec, K, 0.05, dtype, gen)
        if p.kind == "embedding" and p.size == 1:
            params[p.name].uniform_(-0.05, 0.05, generator=gen)

    def step():
        values = {name: t.detach().requires_grad_() for name, t in params.items()}
        log_loss(forward(spec, values, x, slots), y).mean().backward()

    for _ in range(3):  # warm-up
        step()
    steps = 0
    started = time.time()
    while True:
        step()
        steps += 1
        elapsed = time.time() - started
        if elapsed >= args.seconds:
            break
    print(json.dumps({"model": spec.model, "batch": n, "threads": args.threads,
                      "samples_per_s": round(steps * n / elapsed, 1)}), flush=True)
    return 0


def predict(args, parser):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from eps_model import EpsModel, ExportError

    try:
        export = EpsModel(args.model_dir)
    except (ExportError, OSError, ValueError) as e:
        parser.error(str(e))
    m = export.manifest["model"]
    if export.manifest["data"]["format"] != "criteo":
        parser.error("predict reads data.format = criteo exports only")
    spec = ModelSpec(m["type"], m["num_dense"], m["num_fields"], m["embedding_dim"], m["mlp"],
                     m["bottom_mlp"], m["top_mlp"], m["activation"])
    set_threads(args.threads)
    values = {p.name: torch.from_numpy(export.dense(p.name).copy())
              for p in spec.params if p.kind == "dense"}
    tables = [p.name for p in spec.params if p.kind == "embedding"]
    D, F = spec.num_dense, spec.num_fields
    out = open(args.out, "w") if args.out else None
    predictions, labels = [], []
    unseen = 0

    def score(batch):
        nonlocal unseen
        keys, slots = {}, np.empty((len(batch), F), dtype=np.int64)
        for i, (_, _, ids) in enumerate(batch):
            for f, key in enumerate(ids):
                slots[i, f] = keys.setdefault(key, len(keys))
        key_array = np.fromiter(keys.keys(), dtype=np.uint64, count=len(keys))
        for name in tables:
            values[name] = torch.from_numpy(export.rows(name, key_array))
        unseen += export.unseen
        x = torch.from_numpy(np.array([dense for _, dense, _ in batch], dtype=np.float32))
        with torch.no_grad():
            p = torch.sigmoid(forward(spec, values, x, torch.from_numpy(slots))).numpy()
        predictions.append(p)
        labels.extend(label for label, _, _ in batch)
        if out:
            out.write("".join(f"{v:.9g}\n" for v in p))

    batch = []
    for path in expand(args.data):
        with open(path, "rb") as f:
            for raw in f:
                columns = raw.rstrip(b"\r\n").split(b"\t")
                if len(columns) != 1 + D + F:
                    continue  # malformed, as eps skips it
                dense = [math.log1p(v) if v > 0 else 0.0
                         for v in (float(c) if c else 0.0 for c in columns[1:1 + D])]
                ids = [EpsModel.feature_id(f, c) for f, c in enumerate(columns[1 + D:])]
                batch.append((float(columns[0]), dense, ids))
                if len(batch) == args.batch:
                    score(batch)
                    batch = []
    if batch:
        score(batch)
    if out:
        out.close()
    p = np.concatenate(predictions) if predictions else np.zeros(0, np.float32)
    y = np.array(labels, dtype=np.float64)
    print(json.dumps({"records": len(p), "auc": auc(p, y), "logloss": logloss(p, y),
                      "unseen_ids": unseen}))
    return 0


def main():
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("crosscheck", help="forward/backward on a batch the C++ side wrote")
    check.add_argument("dir")
    check.add_argument("--dtype", choices=("float64", "float32"), default="float64")

    def model_flags(p):
        p.add_argument("--model", required=True, choices=MODELS)
        p.add_argument("--batch", type=int, default=1024)
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--embedding-dim", type=int, default=DEFAULT_EMBEDDING_DIM)
        p.add_argument("--mlp", type=parse_sizes, default=list(DEFAULT_MLP))
        p.add_argument("--bottom-mlp", type=parse_sizes, default=list(DEFAULT_BOTTOM_MLP))
        p.add_argument("--top-mlp", type=parse_sizes, default=list(DEFAULT_TOP_MLP))
        p.add_argument("--activation", choices=sorted(ACTIVATIONS), default="relu")

    tr = sub.add_parser("train", help="train on Criteo files, report eval AUC and log loss")
    model_flags(tr)
    tr.add_argument("--train", required=True)
    tr.add_argument("--eval", required=True)
    tr.add_argument("--lr", type=float, default=0.05, help="the tables' Adagrad rate")
    tr.add_argument("--mlp-optimizer", choices=("adam", "adagrad"), default="adam")
    tr.add_argument("--mlp-lr", type=float, default=0.001)
    tr.add_argument("--epochs", type=int, default=1)
    tr.add_argument("--init-scale", type=float, default=DEFAULT_INIT_SCALE)
    tr.add_argument("--initial-accumulator", type=float, default=DEFAULT_INITIAL_ACCUMULATOR)
    tr.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
    tr.add_argument("--seed", type=int, default=1)

    sp = sub.add_parser("speed", help="time forward + backward on a random Criteo-shaped batch")
    model_flags(sp)
    sp.add_argument("--seconds", type=float, default=5.0)
    sp.add_argument("--num-keys", type=int, default=0, help="unique rows K (default batch*26/2)")

    pr = sub.add_parser("predict", help="rebuild an eps model export and score Criteo files")
    pr.add_argument("--model-dir", required=True)
    pr.add_argument("--data", required=True)
    pr.add_argument("--out", default="")
    pr.add_argument("--batch", type=int, default=1024)
    pr.add_argument("--threads", type=int, default=1)

    args = parser.parse_args()
    if getattr(args, "batch", 1) < 1 or getattr(args, "threads", 1) < 1 \
            or getattr(args, "epochs", 1) < 1:
        parser.error("--batch, --threads and --epochs must be positive")
    if args.command == "crosscheck":
        return crosscheck(args)
    if args.command == "train":
        return train(args, parser)
    if args.command == "predict":
        return predict(args, parser)
    return speed(args, parser)


if __name__ == "__main__":
    sys.exit(main())
