#!/usr/bin/python3
"""The cpu-small decoder layers in PyTorch: the peer that `make peer-study` times miniCP against.

The same layers as miniCP's `none` scheme on one rank (docs/DESIGN.md, "The minicp driver"):
RMSNorm, Q/K/V projections with grouped-query attention (kv_heads K/V heads shared by
heads / kv_heads query heads each), RoPE on Q and K, causal softmax attention, the output
projection and a residual; RMSNorm, a SwiGLU MLP and a residual. A train step is the forward
of all layers, an MSE loss (the mean of y^2, in fp32) and the backward to every weight and
to the input.

dtype f32: everything fp32. dtype bf16: weights, activations and gradients stored in bf16,
as mixed-precision training without autocast (PyTorch's bf16 GEMMs accumulate in fp32; the
loss is summed in fp32). torch 1.13 has no scaled_dot_product_attention, so the attention
is matmul, a causal mask and softmax in the dtype, [H, S, S] scores materialised.

Prints one JSON object on stdout: the step times, their median (the upper middle sample, as
docs/figures-of-merit.md defines it), the loss and gradient norms of the last step, the
layer's useful FLOPs by miniCP's count (model::layer_flops), and the platform it ran on
(torch version and threads, its BLAS and the BLAS core, oneDNN). Exit 2 on a bad option,
3 when torch cannot be imported.
"""

import argparse
import ctypes
import json
import math
import os
import sys
import time

from common import int_at_least, median


def positive_float():
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            v = None
        if v is None or not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(f"must be a positive number, got '{text}'")
        return v

    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="peer_layer.py",
        description="Train steps (forward + backward) of Llama-style decoder layers in PyTorch; "
        "JSON on stdout. Defaults: the cpu-small model at S = 4096.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seq-len", type=int_at_least(1), default=4096, help="tokens S")
    p.add_argument("--hidden", type=int_at_least(1), default=1024, help="model width C")
    p.add_argument("--heads", type=int_at_least(1), default=8, help="query heads H")
    p.add_argument("--kv-heads", type=int_at_least(1), default=2, help="K/V heads (divides --heads)")
    p.add_argument("--head-dim", type=int_at_least(1), default=128, help="head dimension D (even)")
    p.add_argument("--ffn", type=int_at_least(1), default=2816, help="MLP width F")
    p.add_argument("--layers", type=int_at_least(1), default=2, help="decoder layers L")
    p.add_argument("--rope-theta", type=positive_float(), default=500000.0, help="RoPE base")
    p.add_argument("--norm-eps", type=positive_float(), default=1e-5, help="RMSNorm epsilon")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                   help="storage type of weights, activations and gradients")
    p.add_argument("--threads", type=int_at_least(1), default=2, help="torch.set_num_threads")
    p.add_argument("--warmup", type=int_at_least(0), default=1, help="untimed steps first")
    p.add_argument("--reps", type=int_at_least(1), default=3, help="timed steps")
    p.add_argument("--seed", type=int_at_least(0), default=1, help="weights and input")
    a = p.parse_args(argv)
    if a.heads % a.kv_heads:
        p.error(f"--kv-heads must divide --heads ({a.heads}), got {a.kv_heads}")
    if a.head_dim % 2:
        p.error(f"--head-dim must be even (RoPE rotates pairs), got {a.head_dim}")
    return a


def useful_flops(a):
    """One train step's useful FLOPs of all layers, miniCP's count (model::layer_flops,
    docs/figures-of-merit.md): the GEMMs 3x (forward, dX, dW), causal attention 3.5x its
    forward 2 S^2 D H; norms, RoPE, SwiGLU and residuals not counted."""
    N, C, H, Hkv, D, F = a.seq_len, a.hidden, a.heads, a.kv_heads, a.head_dim, a.ffn
    gemm = 2.0 * N * C * (H * D + 2 * Hkv * D) + 2.0 * N * H * D * C + 3 * 2.0 * N * C * F
    attention = 4.0 * N * N * D * H * 0.5
    return a.layers * (3 * gemm + 3.5 * attention)


def blas_info(torch, threads):
    """The BLAS torch's process has loaded and, for OpenBLAS, the core it runs. Debian's torch
    links the pthread OpenBLAS, whose threads torch.set_num_threads does not set: they are
    set here to the same count."""
    info = {"blas_library": "", "blas_core": "", "blas_config": "", "blas_threads": 0}
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f if "blas" in line.lower() and "/" in line})
    except OSError:
        libs = []
    info["blas_library"] = " ".join(libs)
    for lib in libs:
        try:
            h = ctypes.CDLL(lib)  # already loaded: the same handle torch uses
            corename = h.openblas_get_corename
        except (OSError, AttributeError):
            continue
        corename.restype = ctypes.c_char_p
        info["blas_core"] = corename().decode()
        config = h.openblas_get_config
        config.restype = ctypes.c_char_p
        info["blas_config"] = config().decode()
        h.openblas_set_num_threads(ctypes.c_int(threads))
        info["blas_threads"] = int(h.openblas_get_num_threads())
        break
    # torch's own build settings, those that say what runs a GEMM.
    for line in torch.__config__.show().splitlines():
        if "Build settings:" in line:
            for kv in line.split("Build settings:", 1)[1].split(", "):
                k, _, v = kv.partition("=")
                if k.strip() in ("BLAS_INFO", "LAPACK_INFO", "USE_MKLDNN", "USE_OPENMP", "TORCH_VERSION"):
                    info["torch_build_" + k.strip().lower()] = v.strip()
    return info


def build(torch, a):
    """Weights (fp32 master, then stored in the dtype) and the input; same values for both
    dtypes at one seed, so a bf16 run is the fp32 run rounded."""
    g = torch.Generator().manual_seed(a.seed)
    C, H, Hkv, D, F = a.hidden, a.heads, a.kv_heads, a.head_dim, a.ffn
    dt = torch.float32 if a.dtype == "f32" else torch.bfloat16

    def w(rows, cols):  # [rows, cols], x @ w
        t = torch.randn(rows, cols, generator=g) / math.sqrt(rows)
        return t.to(dt).requires_grad_()

    layers = []
    for _ in range(a.layers):
        layers.append({
            "attn_norm": torch.ones(C, dtype=dt, requires_grad=True),  # [C]
            "wq": w(C, H * D), "wk": w(C, Hkv * D), "wv": w(C, Hkv * D), "wo": w(H * D, C),
            "mlp_norm": torch.ones(C, dtype=dt, requires_grad=True),  # [C]
            "w_gate": w(C, F), "w_up": w(C, F), "w_down": w(F, C),
        })
    x = torch.randn(a.seq_len, C, generator=g).to(dt).requires_grad_()  # [S, C]
    # RoPE tables [S, D/2], rotate-half pairing (i, i + D/2).
    inv = a.rope_theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2.0 / D)
    ang = torch.arange(a.seq_len, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    # Causal mask [S, S]: True above the diagonal (the future keys).
    mask = torch.ones(a.seq_len, a.seq_len, dtype=torch.bool).triu(1)
    return layers, x, cos, sin, mask


def forward(torch, a, layers, x, cos, sin, mask):
    S, H, Hkv, D = a.seq_len, a.heads, a.kv_heads, a.head_dim
    half = D // 2

    def rmsnorm(t, weight):  # t [S, C]; the mean square in fp32, as miniCP's kernel sums it
        ms = t.float().pow(2).mean(-1, keepdim=True)
        return (t.float() * torch.rsqrt(ms + a.norm_eps)).to(t.dtype) * weight

    def rope(t):  # t [heads, S, D]
        t1, t2 = t[..., :half], t[..., half:]
        return torch.cat([t1 * cos - t2 * sin, t1 * sin + t2 * cos], dim=-1)

    h = x
    for p in layers:
        n = rmsnorm(h, p["attn_norm"])
        q = (n @ p["wq"]).view(S, H, D).transpose(0, 1)  # [H, S, D]
        k = (n @ p["wk"]).view(S, Hkv, D).transpose(0, 1)  # [Hkv, S, D]
        v = (n @ p["wv"]).view(S, Hkv, D).transpose(0, 1)  # [Hkv, S, D]
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(H // Hkv, dim=0)  # [H, S, D]: query head i reads K/V head i // (H/Hkv)
        v = v.repeat_interleave(H // Hkv, dim=0)
        # The 1/sqrt(D) scale on Q [H, S, D] rather than on the scores [H, S, S]: one pass
        # over S*D values instead of S*S, forward and backward.
        scores = (q * (1.0 / math.sqrt(D))) @ k.transpose(1, 2)  # [H, S, S]
        probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        o = (probs @ v).transpose(0, 1).reshape(S, H * D)  # [S, H*D]
        h = h + o @ p["wo"]
        n = rmsnorm(h, p["mlp_norm"])
        gate, up = n @ p["w_gate"], n @ p["w_up"]  # [S, F]
        h = h + (torch.nn.functional.silu(gate) * up) @ p["w_down"]
    return h  # [S, C]


def main(argv):
    a = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"peer_layer.py: cannot import torch ({e}): make peer-deps installs python3-torch", file=sys.stderr)
        return 3
    torch.set_num_threads(a.threads)
    blas = blas_info(torch, a.threads)  # before the first GEMM
    layers, x, cos, sin, mask = build(torch, a)
    params = [t for p in layers for t in p.values()]
    steps, fwd = [], []
    loss = None
    for i in range(a.warmup + a.reps):
        for t in params + [x]:
            t.grad = None
        t0 = time.perf_counter()
        y = forward(torch, a, layers, x, cos, sin, mask)
        loss = y.float().pow(2).mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if i >= a.warmup:
            steps.append(t2 - t0)
            fwd.append(t1 - t0)
    grad_sq = sum(float(t.grad.float().pow(2).sum()) for t in params)
    flops = useful_flops(a)
    out = {
        "program": "peer_layer.py",
        "dtype": a.dtype,
        "shape": {k: getattr(a, k) for k in ("seq_len", "hidden", "heads", "kv_heads", "head_dim", "ffn", "layers")},
        "warmup": a.warmup,
        "reps": a.reps,
        "seed": a.seed,
        "step_s": steps,
        "forward_s": fwd,
        "median_step_s": median(steps),
        "median_forward_s": median(fwd),
        "useful_flops": flops,
        "useful_gflops_per_s": flops / median(steps) / 1e9,
        "loss": float(loss),
        "weight_grad_norm": math.sqrt(grad_sq),
        "input_grad_norm": float(x.grad.float().norm()),
        "platform": {
            "torch_version": torch.__version__,
            "threads": torch.get_num_threads(),
            "mkldnn": bool(torch.backends.mkldnn.is_available()),
            "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", ""),
            **blas,
        },
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
