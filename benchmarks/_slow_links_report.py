"""The tables and the plot of benchmarks/slow_links.py, from the worker's result documents
(one per case: model, hosts, link rate; each holding every method's runs)."""

import statistics

from _report import save_figure
from _slow_links_models import ema, first_below

TARGET_AT = 0.6  # the target loss: the uncompressed run's smoothed loss at this share of its steps


def _by_method(doc):
    out = {}
    for run in doc["runs"]:
        out.setdefault(run["method"], []).append(run)
    return out


def target_loss(doc):
    base = _by_method(doc).get("none")
    if not base:
        return None
    curve = ema(base[0]["losses"])
    return curve[int(TARGET_AT * (len(curve) - 1))]


def _spread(values, fmt):
    mid = statistics.median(values)
    if len(values) < 2:
        return fmt % mid
    return (fmt + " (%s-%s)") % (mid, fmt % min(values), fmt % max(values))


def _ratios(runs, base, key):
    """Per round: this method's value over the uncompressed one of the same round."""
    by_round = {r["round"]: r[key] for r in base}
    return [r[key] / by_round[r["round"]] for r in runs if by_round.get(r["round"])]


def _row(method, runs, base, target):
    walls = [r["wall_s"] for r in runs]
    link = [r["link_bytes"] for r in runs]
    reach = [first_below(r["times"], ema(r["losses"]), target) for r in runs] if target else []
    reached = [t for t in reach if t is not None]
    cells = [
        method,
        _spread(walls, "%.2f"),
        _spread(_ratios(runs, base, "wall_s"), "%.3f") if base else "-",
        "%.1f" % (statistics.median(link) / 1e6),
        "%.4f" % statistics.median(_ratios(runs, base, "link_bytes")) if base else "-",
        _spread(reached, "%.2f") if reached else "not reached",
        "%.1f" % (100 * statistics.median(r["accuracy"] for r in runs)),
        "yes" if all(r["identical"] for r in runs) else "NO",
    ]
    return "| " + " | ".join(cells) + " |"


def case_title(doc):
    return "%s (%s parameters, %d steps, batch %d per rank), %d hosts x %d ranks, links at %s" % (
        doc.get("model"),
        "{:,}".format(doc.get("params", 0)),
        doc.get("steps", 0),
        doc.get("batch", 0),
        doc["hosts"],
        doc["per_host"],
        doc["rate"],
    )


def table(docs, rounds):
    out = [
        "Gradient compression and DiLoCo on simulated hosts with shaped links (tc tbf), one"
        " compute thread per rank; every method in one job, %d round(s) alternating the order;"
        " ratios are per round against the uncompressed hvdlite run (median, min-max)." % rounds,
        "",
    ]
    for doc in docs:
        if "error" in doc:
            out += ["## failed case", "", "```", doc["error"], "```", ""]
            continue
        by = _by_method(doc)
        target = target_loss(doc)
        out += ["## " + case_title(doc), ""]
        if target is not None:
            out += [
                "Target loss %.4f (uncompressed, smoothed, at %d%% of the steps)."
                % (target, 100 * TARGET_AT),
                "",
            ]
        out.append(
            "| method | wall s | wall vs none | link MB | bytes vs none | time to target s | accuracy % | identical |"
        )
        out.append("|---" * 8 + "|")
        base = by.get("none")
        for method, runs in by.items():
            out.append(_row(method, runs, base, target))
        out.append("")
    return "\n".join(out)


def plot(docs, path):
    """Smoothed loss against wall time: one panel per case, a line per method (round 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = [d for d in docs if "error" not in d]
    if not docs:
        return
    cols = min(3, len(docs))
    rows = -(-len(docs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, doc in zip(axes.flat, docs):
        for method, runs in _by_method(doc).items():
            ax.plot(runs[0]["times"], ema(runs[0]["losses"]), label=method, lw=1.2)
        where = (doc["model"], doc["hosts"], doc["per_host"], doc["rate"])
        ax.set_title("%s, %d hosts x %d ranks, %s" % where, fontsize=9)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("training loss (smoothed)")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(docs) :]:
        ax.axis("off")
    save_figure(fig, path, title="Loss against wall time per link speed (benchmarks/slow_links.py)")
