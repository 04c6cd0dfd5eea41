#!/usr/bin/python3
"""KAT against PyTorch epoch times as a bar chart (PNG), from a small CSV.

    scripts/plot_epoch_times.py [--out FILE.png] [--title TEXT] [--linear] CSV

The CSV has the columns setting, model, kat_seconds, pytorch_seconds (others, such as a
source, are ignored): one panel per setting (in the order they first appear), a pair of bars
per model, each pair labelled with KAT / PyTorch. docs/figures/kat_vs_pytorch_epoch_times.csv
holds the numbers recorded in docs/benchmarks.md. Needs Debian's python3-matplotlib
(scripts/setup.sh), hence /usr/bin/python3; draws with the Agg backend (no display).
"""
import argparse
import csv
import os
import sys

from plot_common import InputError, check_out, pyplot, run, save_png

REQUIRED = ("setting", "model", "kat_seconds", "pytorch_seconds")


def read(path):
    if not os.path.isfile(path):
        raise InputError(f"epoch-times file '{path}' does not exist or is not a file")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            raise InputError(f"epoch-times file '{path}' is empty: expected a CSV header "
                             f"'{','.join(REQUIRED)}' and one line per model")
        for c in REQUIRED:
            if c not in reader.fieldnames:
                raise InputError(f"epoch-times file '{path}' has no column '{c}' (expected "
                                 f"{', '.join(REQUIRED)}; the file has {', '.join(reader.fieldnames)})")
        rows = []
        for number, row in enumerate(reader, start=2):
            for c in ("kat_seconds", "pytorch_seconds"):
                try:
                    row[c] = float(row[c])
                except (TypeError, ValueError):
                    raise InputError(f"epoch-times file '{path}', line {number}: column '{c}' is "
                                     f"'{row[c]}', expected a number of seconds") from None
                if not row[c] > 0:
                    raise InputError(f"epoch-times file '{path}', line {number}: column '{c}' is "
                                     f"{row[c]}, expected seconds > 0")
            rows.append(row)
    if not rows:
        raise InputError(f"epoch-times file '{path}' has a header but no rows")
    return rows


def main(argv):
    p = argparse.ArgumentParser(description="KAT against PyTorch epoch times as a bar chart.")
    p.add_argument("csv", help="setting,model,kat_seconds,pytorch_seconds[,...]")
    p.add_argument("--out", default="epoch_times.png", help="the PNG to write")
    p.add_argument("--title", default=None, help="the figure's title")
    p.add_argument("--linear", action="store_true", help="linear time axis (default logarithmic)")
    p.add_argument("--dpi", type=int, default=80, help="dots per inch (default 80)")
    a = p.parse_args(argv)
    check_out(a.out)
    rows = read(a.csv)
    settings = []
    for row in rows:
        if row["setting"] not in settings:
            settings.append(row["setting"])

    plt = pyplot()

    counts = [sum(r["setting"] == s for r in rows) for s in settings]
    fig, axes = plt.subplots(1, len(settings), figsize=(4 + 1.3 * sum(counts), 4.6), dpi=a.dpi,
                             squeeze=False, gridspec_kw={"width_ratios": counts})
    for ax, setting in zip(axes[0], settings):
        group = [r for r in rows if r["setting"] == setting]
        xs = range(len(group))
        width = 0.38
        kat = [r["kat_seconds"] for r in group]
        torch = [r["pytorch_seconds"] for r in group]
        ax.bar([x - width / 2 for x in xs], kat, width, label="KAT", color="C0")
        ax.bar([x + width / 2 for x in xs], torch, width, label="PyTorch", color="C1")
        for x, k, t in zip(xs, kat, torch):
            ax.annotate(f"{k / t:.2f}×", (x, max(k, t)), textcoords="offset points",
                        xytext=(0, 3), ha="center", fontsize="small")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["model"] for r in group], rotation=20, ha="right",
                           fontsize="small")
        if not a.linear:
            ax.set_yscale("log")
        ax.margins(y=0.15)
        ax.set_title(setting, fontsize="medium")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("seconds per epoch" + ("" if a.linear else " (log scale)"))
    axes[0][0].legend(fontsize="small", loc="upper left")
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    save_png(plt, fig, a.out, a.dpi)
    print(f"plot_epoch_times.py: wrote {a.out} ({len(rows)} models in {len(settings)} panel(s))")
    return 0


if __name__ == "__main__":
    run("plot_epoch_times.py", main)
