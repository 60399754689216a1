"""The suite's report (benchmarks/results/report.md): every ratio of hvdlite against its peer,
then each benchmark's own tables and plots. Reads what the scripts wrote into OUT; runs nothing.

Ratio convention, everywhere: peer time / hvdlite time for the same work, so above 1 means
hvdlite is faster (for peak memory: peer bytes / hvdlite bytes, above 1 means hvdlite uses less).
"""

import json
import os

from _report import fmt_size, fmt_time

# zero_gpt: hvdlite's row -> the peers doing the same sharding.
ZERO_PEERS = {"zero1": ["torch-zero", "ds1"], "zero2": ["ds2"], "zero3": ["fsdp2", "fsdp2-keep", "ds3"]}
E2E_PEERS = ["ddp", "horovod", "nocomm"]  # nocomm: no communication at all, the floor


def _load(out_dir, name):
    path = os.path.join(out_dir, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _ratio(peer, mine):
    return "%.2f×" % (peer / mine) if peer and mine else ""


def _collectives(data):
    index = {(r["lib"], r["op"], r["ranks"], r["bytes"]): r for r in data["rows"] if not r.get("error")}
    for (lib, op, n, nbytes), peer in sorted(index.items(), key=lambda kv: kv[0][1:] + (kv[0][0],)):
        mine = index.get(("hvdlite", op, n, nbytes))
        if lib != "hvdlite" and mine:
            case = "%s %s, %d ranks" % (op, fmt_size(nbytes), n)
            yield (
                case,
                fmt_time(mine["median"]),
                lib,
                fmt_time(peer["median"]),
                _ratio(peer["median"], mine["median"]),
            )


def _fusion(data):
    rows = [r for r in data["rows"] if not r.get("error")]
    for n in sorted({r["ranks"] for r in rows}):
        mine = next((r for r in rows if r["ranks"] == n and r["lib"] == "hvdlite"), None)
        for peer in (r for r in rows if r["ranks"] == n and r["lib"] != "hvdlite" and mine):
            case = "ResNet-50's 161 gradients, %d ranks" % n
            yield (
                case,
                fmt_time(mine["median"]),
                peer["lib"],
                fmt_time(peer["median"]),
                _ratio(peer["median"], mine["median"]),
            )


def _e2e(data):
    ok = {(r["model"], r["row"]): r for r in data["results"] if "median_s" in r}
    for model in sorted({m for m, _ in ok}):
        for mine_row in ("hvdlite", "hvdlite-fp16"):
            mine = ok.get((model, mine_row))
            for peer_row in E2E_PEERS:
                peer = ok.get((model, peer_row))
                if mine and peer:
                    case = "%s step (%s)" % (model, mine_row)
                    yield (
                        case,
                        fmt_time(mine["median_s"]),
                        peer_row,
                        fmt_time(peer["median_s"]),
                        _ratio(peer["median_s"], mine["median_s"]),
                    )


def _zero(data):
    ok = {r["row"]: r for r in data["results"] if "median_s" in r}
    for mine_row, peers in ZERO_PEERS.items():
        mine = ok.get(mine_row)
        for peer in (ok[p] for p in peers if p in ok and mine):
            yield (
                "%s step" % mine_row,
                fmt_time(mine["median_s"]),
                peer["row"],
                fmt_time(peer["median_s"]),
                _ratio(peer["median_s"], mine["median_s"]),
            )
            yield (
                "%s peak RSS" % mine_row,
                "%.2f GB" % (mine["peak_rss"] / 1e9),
                peer["row"],
                "%.2f GB" % (peer["peak_rss"] / 1e9),
                _ratio(peer["peak_rss"], mine["peak_rss"]),
            )


def _pipeline(data):
    mine, peer = data.get("hvdlite") or {}, data.get("gloo") or {}
    for kind in ("sleep", "mlp"):
        if kind in mine and kind in peer:
            yield (
                "%s pipeline step" % kind,
                fmt_time(mine[kind]),
                "torch pipelining (gloo)",
                fmt_time(peer[kind]),
                _ratio(peer[kind], mine[kind]),
            )


def _torch_backend(data):
    import statistics

    for row in data.get("allreduce", []):
        med = {lib: statistics.median(t) for lib, t in row["times"].items()}
        yield (
            "dist.all_reduce %s, %d ranks" % (fmt_size(row["bytes"]), row["n"]),
            fmt_time(med["hvdlite"]),
            "gloo",
            fmt_time(med["gloo"]),
            _ratio(med["gloo"], med["hvdlite"]),
        )
    times = data.get("models", {}).get("times", {})
    for kind in ("DDP", "FSDP2"):
        mine, peer = times.get(kind + " hvdlite"), times.get(kind + " gloo")
        if mine and peer:
            m, p = statistics.median(mine), statistics.median(peer)
            yield ("%s step, 25M MLP" % kind, fmt_time(m), "gloo", fmt_time(p), _ratio(p, m))


def _slow_links(data):
    """Per case: torch DDP (gloo) against uncompressed hvdlite, and torch's PowerSGD hook
    against Compression.powersgd; training-loop wall times, medians over rounds."""
    import statistics

    for case in data.get("cases", []):
        walls = {}
        for run in case.get("runs", []):
            walls.setdefault(run["method"], []).append(run["wall_s"])
        med = {m: statistics.median(w) for m, w in walls.items()}
        where = "%s, %d hosts, %s" % (
            case.get("model"),
            case.get("hosts", 0) * case.get("per_host", 1),
            case.get("rate"),
        )
        for mine, peer, label in (
            ("none", "ddp", "DDP (gloo)"),
            ("powersgd", "ddp-powersgd", "DDP PowerSGD hook"),
        ):
            if mine in med and peer in med:
                yield (
                    "%s train, %s" % (mine, where),
                    fmt_time(med[mine]),
                    label,
                    fmt_time(med[peer]),
                    _ratio(med[peer], med[mine]),
                )


RATIOS = {
    "collectives": _collectives,
    "fusion": _fusion,
    "e2e_torch": _e2e,
    "e2e_tf": _e2e,
    "zero_gpt": _zero,
    "pipeline_vs_torch": _pipeline,
    "torch_backend": _torch_backend,
    "slow_links": _slow_links,
}


def _outcome(code, seconds):
    if code == 0:
        return "ran in %.0f s" % seconds
    if isinstance(code, str):
        return "**%s**; what it wrote before is below" % code
    return "**failed (exit code %s)** after %.0f s; what it wrote is below" % (code, seconds)


def _section(out_dir, name, code, seconds):
    lines = ["## %s" % name, "", "`benchmarks/%s.py`: %s." % (name, _outcome(code, seconds)), ""]
    md = os.path.join(out_dir, name + ".md")
    if os.path.exists(md):
        with open(md) as f:  # its headings one level down, under this section
            lines += [("##" + line) if line.startswith("#") else line for line in f.read().splitlines()]
    else:
        lines.append("(no table: the script wrote none)")
    if os.path.exists(os.path.join(out_dir, name + ".png")):
        lines += ["", "![%s](%s.png)" % (name, name)]
    return lines + [""]


def report(out_dir, names, outcomes, mode, seconds, host):
    """The Markdown text of report.md for the scripts `names`, run with `outcomes`
    {name: (exit code or reason, seconds)}."""
    lines = [
        "# hvdlite benchmarks",
        "",
        host,
        "- mode: %s (%.1f minutes in all); `make bench` = default, `BENCH_FULL=1 make bench` = full sweep"
        % (mode, seconds / 60),
        "- every ratio is peer time / hvdlite time for the same work: above 1, hvdlite is faster "
        "(peak RSS: peer / hvdlite, above 1, hvdlite uses less); medians, one compute thread per rank",
        "",
        "## Ratios against the peers",
        "",
        "| benchmark | case | hvdlite | peer | peer's | peer / hvdlite |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        data = _load(out_dir, name)
        if name in RATIOS and data:
            for case, mine, peer, theirs, ratio in RATIOS[name](data):
                lines.append("| %s | %s | %s | %s | %s | %s |" % (name, case, mine, peer, theirs, ratio))
    lines.append("")
    for name in names:
        code, took = outcomes.get(name, ("not run", 0.0))
        lines += _section(out_dir, name, code, took)
    return "\n".join(lines)
