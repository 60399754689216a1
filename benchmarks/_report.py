"""Turns the ranks' raw timings into nccl-tests rows, a Markdown report and a busbw plot.

    rows = combine(lib, n, docs)        # one row per (op, size) of one job
    text = markdown(rows, peers, ranks, ops, notes)
    plot(rows, libs, ranks, ops, path)

A row: {"lib", "ranks", "op", "bytes", "median", "min" (seconds per call: the max over ranks
of each repetition, then median / min over repetitions), "algbw", "busbw" (GB/s, 1e9 B/s),
"wrong" (summed over ranks), "others" (share of the machine other processes used while the
repetitions ran), "error"}.
"""

import json
import os
import statistics
import textwrap

from _cases import BUS_FACTOR
from _machine import BUSY_LIMIT


def combine(lib, n, docs, bus_factor=None):
    """Rows of one job from its rank docs (ranks that wrote fewer entries cut the list short).
    bus_factor(n) defaults to BUS_FACTOR of each entry's op."""
    rows = []
    depth = min((len(d["entries"]) for d in docs), default=0)
    for i in range(depth):
        entries = [d["entries"][i] for d in docs]
        head = entries[0]
        row = {"lib": lib, "ranks": n, "op": head["op"], "bytes": head["bytes"], "error": None}
        errors = [e["error"] for e in entries if "error" in e]
        if errors or len(docs) < n:
            row["error"] = errors[0] if errors else "only %d of %d ranks reported" % (len(docs), n)
            rows.append(row)
            continue
        per_rep = [max(ts) for ts in zip(*(e["times"] for e in entries))]
        row["median"], row["min"] = statistics.median(per_rep), min(per_rep)
        row["algbw"] = head["bytes"] / row["median"] / 1e9
        row["busbw"] = row["algbw"] * (bus_factor or BUS_FACTOR[head["op"]])(n)
        row["wrong"] = sum(e["wrong"] for e in entries)
        row["others"] = head["load"]["others"]
        rows.append(row)
    return rows


def fmt_size(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return "%d %s" % (nbytes // scale, unit)
    return "%d B" % nbytes


def fmt_time(seconds):
    if seconds < 1e-3:
        return "%.1f µs" % (seconds * 1e6)
    if seconds < 1.0:
        return "%.2f ms" % (seconds * 1e3)
    return "%.2f s" % seconds


def fmt_others(share):
    text = "%.0f%%" % (100 * share)
    return text + " !" if share > BUSY_LIMIT else text


def _cells(row):
    if row.get("error"):
        return ["error: %s" % row["error"].replace("|", "/"), "", "", "", "", ""]
    return [
        fmt_time(row["median"]),
        fmt_time(row["min"]),
        "%.3f" % row["algbw"],
        "%.3f" % row["busbw"],
        str(row["wrong"]),
        fmt_others(row["others"]),
    ]


def _table(rows, libs, peers, n, op):
    """Markdown lines of one (op, ranks) table: a row per size and library; the ratio columns
    (hvdlite busbw / peer busbw) are filled on hvdlite's row."""
    index = {(r["lib"], r["bytes"]): r for r in rows if r["ranks"] == n and r["op"] == op}
    sizes = sorted({b for (_, b) in index})
    head = [
        "size",
        "library",
        "time median",
        "time min",
        "algbw GB/s",
        "busbw GB/s",
        "#wrong",
        "others CPU",
    ] + ["hvdlite/%s" % p for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for nbytes in sizes:
        for lib in libs:
            row = index.get((lib, nbytes))
            if row is None:
                continue
            ratios = []
            for p in peers:
                peer, mine = index.get((p, nbytes)), index.get(("hvdlite", nbytes))
                ok = lib == "hvdlite" and peer and mine and not peer.get("error") and not mine.get("error")
                ratios.append("%.2f×" % (mine["busbw"] / peer["busbw"]) if ok and peer["busbw"] > 0 else "")
            lines.append("| " + " | ".join([fmt_size(nbytes), lib] + _cells(row) + ratios) + " |")
    return lines


_FACTOR_TEXT = {
    "allreduce": "2(n−1)/n",
    "allgather": "(n−1)/n",
    "reducescatter": "(n−1)/n",
    "alltoall": "(n−1)/n",
    "broadcast": "1",
}


def markdown(rows, libs, ranks, ops, notes):
    """The whole report: `notes` (lines) first, then one table per (op, ranks)."""
    peers = [lib for lib in libs if lib != "hvdlite"]
    out = list(notes) + [""]
    for op in ops:
        for n in ranks:
            if not any(r["ranks"] == n and r["op"] == op for r in rows):
                continue
            out.append("## %s, %d ranks (busbw = algbw × %s)" % (op, n, _FACTOR_TEXT[op]))
            out.append("")
            out.extend(_table(rows, libs, peers, n, op))
            out.append("")
    return "\n".join(out)


def write_outputs(out_dir, stem, text, data=None, plot=None):
    """Every driver's outputs: OUT/<stem>.md (`text`), OUT/<stem>.json (`data`, what _suite.py
    reads for its ratios) and OUT/<stem>.png (`plot(path)`), each when given; prints `text` and
    what it wrote."""
    os.makedirs(out_dir, exist_ok=True)
    written = ["md"]
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write(text + "\n")
    if data is not None:
        with open(os.path.join(out_dir, stem + ".json"), "w") as f:
            json.dump(data, f, indent=1)
        written.append("json")
    if plot is not None:
        plot(os.path.join(out_dir, stem + ".png"))
        written.append("png")
    print("\n%s\n\nwrote %s/%s.{%s}" % (text, out_dir, stem, ",".join(written)), flush=True)


def save_figure(fig, path, title=None, dpi=110):
    """Saves a matplotlib figure with its title whole: `title` is wrapped to the figure's width
    (a long suptitle on a narrow figure used to be cut at both edges), and the saved area grows
    to hold every title and label (bbox_inches="tight"). Closes the figure."""
    import matplotlib.pyplot as plt

    if title:
        fontsize = 10
        chars = max(20, int(fig.get_figwidth() * 72 / (0.6 * fontsize)))  # ~0.6 em per character
        fig.suptitle("\n".join(textwrap.wrap(title, chars)), fontsize=fontsize)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)


_COLORS = {"hvdlite": "C0", "gloo": "C1", "mpi": "C2", "horovod": "C3"}


def plot(rows, libs, ranks, ops, path):
    """PNG of busbw against size: a panel per (ranks, op), a line per library."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(ranks), len(ops), figsize=(4.2 * len(ops), 3.6 * len(ranks)), squeeze=False, sharex=True
    )
    for i, n in enumerate(ranks):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            for lib in libs:
                pts = sorted(
                    (r["bytes"], r["busbw"], r["others"])
                    for r in rows
                    if r["lib"] == lib
                    and r["ranks"] == n
                    and r["op"] == op
                    and not r.get("error")
                    and r["busbw"] > 0
                )
                if pts:
                    color = _COLORS.get(lib, "k")
                    ax.plot(
                        [p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=lib, color=color
                    )
                    busy = [p for p in pts if p[2] > BUSY_LIMIT]
                    ax.plot(
                        [p[0] for p in busy],
                        [p[1] for p in busy],
                        ls="",
                        marker="o",
                        ms=7,
                        mfc="none",
                        color=color,
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title("%s, %d ranks" % (op, n), fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            sizes = sorted({r["bytes"] for r in rows if r["op"] == op})
            if sizes:
                ax.set_xticks(sizes)
                ax.set_xticklabels([fmt_size(s).replace(" ", "") for s in sizes], rotation=60, fontsize=7)
            if j == 0:
                ax.set_ylabel("busbw (GB/s)")
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    title = "busbw against size (circled: others used > %.0f%% of the machine meanwhile)" % (100 * BUSY_LIMIT)
    save_figure(fig, path, title)
