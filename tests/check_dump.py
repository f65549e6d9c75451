#!/usr/bin/env python3
"""Checks a miniCP --dump file against an independent numpy implementation of the layer
stack, written from the definition in docs/results-file.md (section "--dump FILE.h5"):

  per layer:  h  = rmsnorm(x, attn_norm)              rmsnorm(x, w) = x / sqrt(mean(x^2) + eps) * w
              q, k, v = h @ wq, h @ wk, h @ wv         split into heads of head_dim
              q, k = rope(q), rope(k)                  rotate-half at the token's global position
              o  = attention(q, k, v)                  softmax(scale q.k) v over the visible keys;
                                                       query head h uses K/V head h // (heads/kv_heads)
              x2 = x + o @ wo
              y  = x2 + (silu(h2 @ w1) * (h2 @ w3)) @ w2,   h2 = rmsnorm(x2, mlp_norm)
  mask:       key j visible from query row i iff keys[i, 0] <= pos_j <= keys[i, 1]
              (/mask/keys: every mask kind sees one interval of keys; the file says which)

Checks: every root attribute, every dataset's presence and shape; the forward in float64
from /tensors/x and the weights reproduces /tensors/y (rows must be in global token order
for that); train: central finite differences (h = 1e-6) of loss = sum(y * dy) with respect to
a sample of the entries of x and of every parameter of every layer match /tensors/dx and the
d<param> datasets; decode: the T new tokens at positions S.. against the cache
(cache_k = K after RoPE, cache_v = V of tokens 0..S-1) and, under the same mask, each other.
Exit code 0 when everything holds, 1 otherwise (each failure printed).

With DP (attribute dp > 1) the activations hold dp sequences, replica d's at rows d*N..: each
is checked on its own, and the weight gradients against the finite differences of the
replicas' mean loss.

Usage: check_dump.py FILE [--pass P] [--scheme NAME] [--ranks N] [--tp T] [--dp D] [--mask M] [--dtype f32|f64]
       (each option, when given, is also required of the file's attributes)
       --corrupt KIND   (for the test suite) damage the data after reading, to show that the
                        check catches it: rows (reverse the token order of the activations),
                        grads (halve every weight gradient), theta (a wrong rope_theta),
                        mask (every query sees every key)."""
import argparse
import sys

import h5py
import numpy as np

PARAMS = ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w1", "w3", "w2"]
ROPE_CONVENTION = ("rotate-half, angle = position * rope_theta^(-2i/head_dim), i < head_dim/2, positions 0..S-1 "
                   "(decode: the new tokens at S..S+T-1)")
INT_ATTRS = ["heads", "kv_heads", "head_dim", "layers", "hidden", "ffn", "seq_len",
             "ranks", "tp", "dp"]
FLOAT_ATTRS = ["rope_theta", "norm_eps"]
STR_ATTRS = ["file_kind", "mask", "scheme", "dtype", "pass", "rope_convention"]


class Model:
    """The stack's hyperparameters and mask, from the root attributes."""

    def __init__(self, a):
        self.H, self.Hkv, self.D = int(a["heads"]), int(a["kv_heads"]), int(a["head_dim"])
        self.C, self.F, self.L = int(a["hidden"]), int(a["ffn"]), int(a["layers"])
        self.theta, self.eps = float(a["rope_theta"]), float(a["norm_eps"])
        self.keys, self.q0 = None, 0  # /mask/keys [Nq, 2] and the first query's position (read_datasets)
        self.scale = float(a.get("softmax_scale", 1.0 / np.sqrt(self.D)))

    def shapes(self):
        C, HD, KD, F = self.C, self.H * self.D, self.Hkv * self.D, self.F
        return {"attn_norm": (C,), "wq": (C, HD), "wk": (C, KD), "wv": (C, KD), "wo": (HD, C),
                "mlp_norm": (C,), "w1": (C, F), "w3": (C, F), "w2": (F, C)}

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):  # x [N, heads, D] at global positions pos [N]
        half = self.D // 2
        freq = self.theta ** (-2.0 * np.arange(half) / self.D)
        ang = pos[:, None].astype(np.float64) * freq[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def visible(self, qpos, kpos):
        rows = self.keys[qpos - self.q0]
        k = kpos[None, :]
        return (k >= rows[:, :1]) & (k <= rows[:, 1:])

    def attention(self, q, k, v, qpos, kpos):  # q [Nq,H,D], k, v [Nk,Hkv,D] -> [Nq,H,D]
        group = self.H // self.Hkv
        kh, vh = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # head h -> kv head h // group
        s = np.einsum("qhd,khd->hqk", q, kh) * self.scale
        vis = self.visible(qpos, kpos)[None]
        s = np.where(vis, s, -np.inf)
        m = np.max(s, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.where(vis, np.exp(s - m), 0.0)
        den = np.sum(p, axis=-1, keepdims=True)
        p = p / np.where(den > 0, den, 1.0)  # no visible key: output 0
        return np.einsum("hqk,khd->qhd", p, vh)

    def layer(self, x, w, pos, cache=None):
        N = x.shape[0]
        h = self.rmsnorm(x, w["attn_norm"])
        q = self.rope((h @ w["wq"]).reshape(N, self.H, self.D), pos)
        k = self.rope((h @ w["wk"]).reshape(N, self.Hkv, self.D), pos)
        v = (h @ w["wv"]).reshape(N, self.Hkv, self.D)
        kpos = pos
        if cache is not None:  # decode: the cache's tokens 0..S-1 first, then the new ones
            ck, cv = cache
            S = ck.shape[0]
            k = np.concatenate([ck.reshape(S, self.Hkv, self.D), k])
            v = np.concatenate([cv.reshape(S, self.Hkv, self.D), v])
            kpos = np.concatenate([np.arange(S), pos])
        o = self.attention(q, k, v, pos, kpos).reshape(N, self.H * self.D)
        x2 = x + o @ w["wo"]
        h2 = self.rmsnorm(x2, w["mlp_norm"])
        a, b = h2 @ w["w1"], h2 @ w["w3"]
        return x2 + (a / (1.0 + np.exp(-a)) * b) @ w["w2"]

    def forward(self, x, weights, pos, caches=None):
        for l in range(self.L):
            x = self.layer(x, weights[l], pos, None if caches is None else caches[l])
        return x

    def forward_replicas(self, x, weights, pos, caches=None):
        """The forward of each DP replica's sequence: x holds them one after another (len(pos)
        rows each), the caches likewise (S rows each)."""
        n = len(pos)
        dp, ys = x.shape[0] // n, []
        for d in range(dp):
            cd = None
            if caches is not None:
                S = caches[0][0].shape[0] // dp
                cd = [(k[d * S:(d + 1) * S], v[d * S:(d + 1) * S]) for k, v in caches]
            ys.append(self.forward(x[d * n:(d + 1) * n], weights, pos, cd))
        return np.concatenate(ys)


def text(v):
    return v.decode() if isinstance(v, (bytes, np.bytes_)) else v


def rel_err(got, want):
    return float(np.max(np.abs(got - want)) / max(1e-300, float(np.max(np.abs(want)))))


def attribute_type_errors(a):
    """Each root attribute present with its type: integer, float or string."""
    errors = []
    for k in INT_ATTRS:
        if k not in a or not np.issubdtype(np.asarray(a[k]).dtype, np.integer):
            errors.append(f"root attribute '{k}' missing or not an integer ({a.get(k)!r})")
    for k in FLOAT_ATTRS:
        if k not in a or not np.issubdtype(np.asarray(a[k]).dtype, np.floating):
            errors.append(f"root attribute '{k}' missing or not a float ({a.get(k)!r})")
    for k in STR_ATTRS:
        if k not in a or not isinstance(text(a[k]), str):
            errors.append(f"root attribute '{k}' missing or not a string ({a.get(k)!r})")
    return errors


def attribute_value_errors(a, args):
    """The root attributes' values agree with each other, the definition and the options."""
    p = a["pass"]
    if p not in ("train", "prefill", "decode"):
        return [f"pass = {p!r}, expected train, prefill or decode"]
    errors = []
    err = errors.append
    if p == "decode" and "decode_tokens" not in a:
        err("decode dump without the root attribute 'decode_tokens'")
    if a["file_kind"] != "minicp dump":
        err(f"file_kind = {a['file_kind']!r}, expected 'minicp dump'")
    if a["rope_convention"] != ROPE_CONVENTION:
        err(f"rope_convention = {a['rope_convention']!r}, expected {ROPE_CONVENTION!r}")
    if a["dtype"] not in ("f32", "f64"):
        err(f"dtype = {a['dtype']!r}, expected f32 or f64")
    for k in ("heads", "kv_heads", "head_dim", "layers", "hidden", "ffn", "seq_len", "ranks", "tp", "dp"):
        if a[k] < 1:
            err(f"{k} = {a[k]}, expected >= 1")
    if a["heads"] % max(1, a["kv_heads"]) or a["head_dim"] % 2:
        err(f"heads ({a['heads']}) must be a multiple of kv_heads ({a['kv_heads']}) and head_dim even")
    if not (a["rope_theta"] > 1 and a["norm_eps"] > 0):
        err(f"rope_theta = {a['rope_theta']}, norm_eps = {a['norm_eps']}")
    for opt, key in (("pass_", "pass"), ("scheme", "scheme"), ("ranks", "ranks"), ("tp", "tp"), ("dp", "dp"), ("mask", "mask"),
                     ("dtype", "dtype")):
        want = getattr(args, opt)
        if want is not None and str(a[key]) != str(want):
            err(f"{key} = {a[key]!r}, expected {want!r}")
    return errors


def expected_datasets(m, a):
    """{name under /tensors: shape} of a dump of this pass."""
    p, S, dp = a["pass"], int(a["seq_len"]), int(a["dp"])
    N = (int(a["decode_tokens"]) if p == "decode" else S) * dp  # every DP replica's rows
    expect = {"x": (N, m.C), "y": (N, m.C)}
    if p == "train":
        expect.update({"dy": (N, m.C), "dx": (N, m.C)})
    shapes = m.shapes()
    for l in range(m.L):
        for name, shape in shapes.items():
            expect[f"layers/{l}/{name}"] = shape
            if p == "train":
                expect[f"layers/{l}/d{name}"] = shape
        if p == "decode":
            for name in ("cache_k", "cache_v"):
                expect[f"layers/{l}/{name}"] = (S * dp, m.Hkv * m.D)
    return expect


def read_datasets(f, m, a):
    """(errors, {name: float64 array}): every expected dataset present with its shape and
    dtype, none other, and the layer groups 0..L-1."""
    errors = []
    err = errors.append
    expect = expected_datasets(m, a)
    want_dt = np.float32 if a["dtype"] == "f32" else np.float64
    if "tensors" not in f:
        return ["no group /tensors"], {}
    t = f["tensors"]
    data = {}
    for name, shape in expect.items():
        if name not in t:
            err(f"missing dataset /tensors/{name}")
            continue
        d = t[name]
        if d.shape != shape:
            err(f"/tensors/{name}: shape {d.shape}, expected {shape}")
        if d.dtype != want_dt:
            err(f"/tensors/{name}: dtype {d.dtype}, expected {np.dtype(want_dt)} (dtype = {a['dtype']})")
        data[name] = d[...].astype(np.float64)
    for name in ("dy", "dx"):
        if a["pass"] != "train" and name in t:
            err(f"/tensors/{name} present in a {a['pass']} dump")
    if "layers" in t:
        present = sorted(t["layers"].keys(), key=lambda s: (len(s), s))
        if present != [str(l) for l in range(m.L)]:
            err(f"/tensors/layers holds {present}, expected 0..{m.L - 1}")
        for l in range(m.L):
            extra = set(t["layers"].get(str(l), {}).keys()) - {n.split("/")[-1] for n in expect
                                                                if n.startswith(f"layers/{l}/")}
            if extra:
                err(f"/tensors/layers/{l}: unexpected datasets {sorted(extra)}")
    return errors, data


def corrupt(kind, m, data):
    """The damage of --corrupt (test only), in place."""
    if kind == "rows":
        for name in ("x", "y", "dy", "dx"):
            if name in data:
                data[name] = data[name][::-1].copy()
    elif kind == "grads":
        for name in list(data):
            if name.split("/")[-1] in ["d" + q for q in PARAMS]:
                data[name] *= 0.5
    elif kind == "theta":
        m.theta *= 1.5
    elif kind == "mask":  # every query sees every key
        m.keys = np.stack([np.zeros(len(m.keys), np.int64), np.full(len(m.keys), m.keys.max())], axis=1)


def read_mask(f, m, a):
    """Errors of /mask/keys ([Nq, 2] integer key intervals, one per query row, inside the
    keys there are); sets m.keys and m.q0 when it holds."""
    S = int(a["seq_len"])
    N, q0 = (int(a["decode_tokens"]), S) if a["pass"] == "decode" else (S, 0)
    if "mask" not in f or "keys" not in f["mask"]:
        return ["missing dataset /mask/keys"]
    d = f["mask/keys"]
    if d.shape != (N, 2) or d.dtype.kind not in "iu":
        return [f"/mask/keys: shape {d.shape} dtype {d.dtype}, expected ({N}, 2) integers"]
    keys = d[...].astype(np.int64)
    last = q0 + N - 1  # the last key position: the last query's (train) or new token's (decode)
    if keys.min() < 0 or keys.max() > last:
        return [f"/mask/keys: key positions outside 0..{last}"]
    m.keys, m.q0 = keys, q0
    return []


def forward_errors(path, m, a, data, weights, pos):
    """/tensors/y against the float64 forward from /tensors/x (and the caches of a decode dump)."""
    y_tol = 2e-4 if a["dtype"] == "f32" else 1e-9
    caches = None
    if a["pass"] == "decode":
        caches = [(data[f"layers/{l}/cache_k"], data[f"layers/{l}/cache_v"]) for l in range(m.L)]
    y = m.forward_replicas(data["x"], weights, pos, caches)
    e = rel_err(data["y"], y)
    print(f"{path}: y: relative max error {e:.3e} (tolerance {y_tol:g})")
    if not e < y_tol:
        return [f"/tensors/y differs from the numpy forward: relative max error {e:.3e} >= {y_tol:g}"]
    return []


def gradient_errors(path, m, a, data, weights, pos, samples):
    """dx and every d<param> against central finite differences of loss = sum(y * dy), on the
    largest entry and a random sample of each tensor. With DP each replica's dx is its own
    loss's gradient, and the weight gradients are the replicas' mean: of loss / dp."""
    errors = []
    dy, h = data["dy"], 1e-6
    g_tol = 2e-3 if a["dtype"] == "f32" else 1e-5
    rng = np.random.default_rng(12345)
    dp = int(a["dp"])

    def loss(x, ws, per=1):
        return float(np.sum(m.forward_replicas(x, ws, pos) * dy)) / per

    def probe(what, grad, perturb, count):
        """perturb(index, delta) -> loss with that entry moved by delta."""
        flat = grad.reshape(-1)
        idx = {int(np.argmax(np.abs(flat)))} | {int(i) for i in rng.choice(flat.size, min(count, flat.size), False)}
        gmax = float(np.max(np.abs(flat)))
        worst = 0.0
        for i in sorted(idx):
            fd = (perturb(i, h) - perturb(i, -h)) / (2 * h)
            # relative to the entry, or to a tenth of the tensor's largest entry when the entry is
            # small (its absolute error is that of the difference quotient, not its own size)
            rel = abs(fd - flat[i]) / max(abs(flat[i]), 0.1 * gmax, 1e-300)
            worst = max(worst, rel)
            if not rel < g_tol:
                errors.append(f"/tensors/{what}: entry {np.unravel_index(i, grad.shape)} is {flat[i]:.10g}, finite "
                              f"difference {fd:.10g} (relative error {rel:.3e} >= {g_tol:g})")
        return worst

    def perturb_x(i, delta):
        x = data["x"].copy()
        x.reshape(-1)[i] += delta
        return loss(x, weights)

    worst = {"dx": probe("dx", data["dx"], perturb_x, samples * 2)}
    for l in range(m.L):
        for name in PARAMS:
            def perturb_w(i, delta, l=l, name=name):
                ws = [dict(w) for w in weights]
                ws[l][name] = weights[l][name].copy()
                ws[l][name].reshape(-1)[i] += delta
                return loss(data["x"], ws, dp)
            key = f"layers/{l}/d{name}"
            worst[key] = probe(key, data[key], perturb_w, samples)
    print(f"{path}: gradients: worst relative error {max(worst.values()):.3e} over dx and "
          f"{len(worst) - 1} weight gradients (tolerance {g_tol:g})")
    return errors


def check(path, args):
    """The failures of the dump at path: its attributes, then its datasets, then (when both
    hold) the forward and, for train, the gradients."""
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        return [f"cannot open: {e}"]
    with f:
        a = {k: f.attrs[k] for k in f.attrs}
        errors = attribute_type_errors(a)
        if errors:
            return errors
        a = {k: text(v) for k, v in a.items()}
        errors = attribute_value_errors(a, args)
        if errors:
            return errors
        m = Model(a)
        errors, data = read_datasets(f, m, a)
        errors += read_mask(f, m, a)
        if errors:
            return errors
    corrupt(args.corrupt, m, data)
    weights = [{name: data[f"layers/{l}/{name}"] for name in PARAMS} for l in range(m.L)]
    S = int(a["seq_len"])
    pos = np.arange(S, S + int(a["decode_tokens"])) if a["pass"] == "decode" else np.arange(S)
    errors = forward_errors(path, m, a, data, weights, pos)
    if a["pass"] != "train":
        return errors
    return errors + gradient_errors(path, m, a, data, weights, pos, args.samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--pass", dest="pass_", choices=["train", "prefill", "decode"])
    ap.add_argument("--scheme")
    ap.add_argument("--ranks", type=int)
    ap.add_argument("--tp", type=int, help="the tensor-parallel degree the file must have (its attribute tp)")
    ap.add_argument("--dp", type=int, help="the data-parallel degree the file must have (its attribute dp)")
    ap.add_argument("--mask", help="the mask's name the file must have (its attribute mask)")
    ap.add_argument("--dtype", choices=["f32", "f64"])
    ap.add_argument("--samples", type=int, default=4, help="random entries probed per weight tensor (dx: twice)")
    ap.add_argument("--corrupt", choices=["rows", "grads", "theta", "mask"])
    args = ap.parse_args()
    errors = check(args.file, args)
    for e in errors:
        print(f"{args.file}: FAIL: {e}")
    if not errors:
        print(f"{args.file}: ok")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
