"""The fidelity study's file (studies/fidelity_study.py, from minicp-fidelity runs):
each row is one tensor's error against fp64 (rel_fro = ||x - x64||_F / ||x64||_F) of one
scheme, mask, head layout, precision and rank count, beside the error of the single-rank
`none` in the same precision on the same inputs. A scheme's ratio is its rel_fro over
none's; the rule (DESIGN.md) is a ratio of at most 2, and at most 1.1 for bf16 attention
outputs other than LSE, whose merges are fp32 (limit(row))."""
import json
import math

from . import UsageError

FILE_KIND = "minicp fidelity study"
LIMIT = 2.0  # a scheme's error at most this many times the single-rank error
# bf16 attention's O, dQ, dK, dV, merged in fp32: a lost fp32 accumulator (the running
# output rounded to bf16 at every merge) reads 1.14-1.80x at 3-8 ranks, correct schemes
# 0.95-1.04x (tests/test_cp.cpp, kBf16MeanRatio).
MEAN_LIMIT = 1.1
VARIANTS = ("f32", "bf16", "bf16-wire")


def limit(row):
    """The largest ratio the rule allows the row."""
    fp32_merges = row["variant"] == "bf16" and row["level"] == "attention" and row["tensor"] != "LSE"
    return MEAN_LIMIT if fp32_merges else LIMIT


def is_fidelity_file(path):
    """True when path is a JSON file the fidelity study wrote (read by its first bytes)."""
    if not path.lower().endswith(".json"):
        return False
    try:
        with open(path) as fh:
            return json.load(fh).get("file_kind") == FILE_KIND
    except (OSError, ValueError, AttributeError):
        return False


def load(path):
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror})")
    except ValueError as e:
        raise UsageError(f"{path}: not JSON ({e})")
    if not isinstance(doc, dict) or doc.get("file_kind") != FILE_KIND:
        raise UsageError(f"{path}: not a fidelity study file (file_kind is not '{FILE_KIND}')")
    return doc


def ratio(row):
    """The scheme's error over none's; 1 where both are 0 (exact), inf where only none's is."""
    a, b = row["rel_fro"], row["none_rel_fro"]
    if a is None or b is None:
        return math.nan
    if b == 0:
        return 1.0 if a == 0 else math.inf
    return a / b


def worst(rows):
    """{(level, variant, scheme): {ranks: (worst ratio, the row)}} over masks, head layouts, tensors."""
    out = {}
    for r in rows:
        key = (r["level"], r["variant"], r["scheme"])
        q = ratio(r)
        cell = out.setdefault(key, {})
        if r["ranks"] not in cell or not (q <= cell[r["ranks"]][0]):
            cell[r["ranks"]] = (q, r)
    return out


def table_markdown(doc):
    """The study's table: per level, precision and scheme, the worst ratio at each rank count
    (the tensor and mask where it is worst at the largest P), and whether it meets the rule."""
    rows = doc["rows"]
    ranks = sorted({r["ranks"] for r in rows})
    w = worst(rows)
    inside = {}  # (level, variant, scheme): every row within its limit
    for r in rows:
        key = (r["level"], r["variant"], r["scheme"])
        inside[key] = inside.get(key, True) and ratio(r) <= limit(r)
    head = ("| level | precision | scheme | " + " | ".join(f"P={p}" for p in ranks) +
            " | worst at largest P | within the rule |")
    lines = [head, "|" + "---|" * (len(ranks) + 5)]
    for level in ("attention", "layer"):
        for variant in VARIANTS:
            for (lv, var, scheme), cell in sorted(w.items(), key=lambda kv: kv[0][2]):
                if lv != level or var != variant:
                    continue
                cells = [f"{cell[p][0]:.2f}" if p in cell else "—" for p in ranks]
                top = cell[max(cell)][1]
                ok = inside[(lv, var, scheme)]
                lines.append(f"| {level} | {variant} | {scheme} | " + " | ".join(cells) +
                             f" | {top['tensor']}, {top['mask']}, kv_heads {top['kv_heads']} | "
                             f"{'yes' if ok else '**no**'} |")
    return "\n".join(lines)


def none_errors_markdown(doc):
    """The single-rank errors the ratios divide by: the largest rel_fro of `none` per level,
    precision and tensor (over masks and head layouts)."""
    big = {}
    for r in doc["rows"]:
        key = (r["level"], r["variant"], r["tensor"] if r["level"] == "attention" or r["tensor"] in ("y", "dx")
               else "dW (every weight)")
        big[key] = max(big.get(key, 0.0), r["none_rel_fro"] or 0.0)
    lines = ["| level | precision | tensor | none's largest rel. Frobenius error |", "|---|---|---|---|"]
    for (level, variant, tensor), v in sorted(big.items()):
        lines.append(f"| {level} | {variant} | {tensor} | {v:.2e} |")
    return "\n".join(lines)


def figure(doc, title):
    """Worst ratio to `none` against P, one line per scheme: a panel per level, bf16 solid
    and bf16 with bf16 accumulators dashed, the rule's limit as a grey line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .data import registry_from
    from .plots import color

    reg = registry_from([doc["scheme_registry"]] if isinstance(doc.get("scheme_registry"), list) else [])
    w = worst(doc["rows"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), squeeze=False)
    for ax, level in zip(axes[0], ("attention", "layer")):
        for (lv, var, scheme), cell in sorted(w.items()):
            if lv != level or var not in ("bf16", "bf16-wire"):
                continue
            ps = sorted(cell)
            ax.plot(ps, [cell[p][0] for p in ps], marker="o", color=color(scheme, reg),
                    linestyle="-" if var == "bf16" else "--", label=f"{scheme} ({var})")
        ax.axhline(LIMIT, color="grey", linewidth=1)
        ax.set_xlabel("ranks P")
        ax.set_ylabel("worst error / single-rank error (bf16)")
        ax.set_title(f"{level} level")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
