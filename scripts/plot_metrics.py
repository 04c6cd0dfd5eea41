#!/usr/bin/python3
"""Training curves as a PNG from kat_train --metrics files (CSV or JSON lines).

    scripts/plot_metrics.py [--out curves.png] [--title TEXT] [--x epoch|time|both]
                            [--extra COLUMN]... [--size WxH] [--dpi N] [LABEL=]FILE...

Each FILE is one run; its legend label is LABEL, or the file name without its extension.
The figure has one row for the loss (train solid, test dashed), one for the test accuracy,
and one per --extra column (any other column of the files, e.g. density, internode_bytes),
against the epoch and/or the training wall-clock seconds summed over the epochs (kat_train's
wall_seconds: the training part of each epoch, evaluation excluded). Needs matplotlib
(Debian's python3-matplotlib, installed by scripts/setup.sh); draws with the Agg backend,
so no display is needed. The shebang is Debian's /usr/bin/python3, whose dist-packages hold
the package (a python3 earlier on PATH, pyenv's say, would not see it). docs/guide.md,
"Plotting training curves".
"""
import argparse
import csv
import json
import os
import sys

from plot_common import InputError, check_out, pyplot, run, save_png

# The columns every kat_train --metrics file starts with (include/kat/train/metrics_writer.hpp).
REQUIRED = ("epoch", "wall_seconds", "train_loss", "test_loss", "test_accuracy")
HEADER = "epoch,wall_seconds,samples_per_second,train_loss,test_loss,test_accuracy,lr"


def read_rows(path):
    """The file's rows as a list of {column: float}, and its column names in order."""
    if not os.path.exists(path):
        raise InputError(f"metrics file '{path}' does not exist")
    if not os.path.isfile(path):
        raise InputError(f"metrics file '{path}' is not a regular file")
    if path.endswith(".csv"):
        kind = "csv"
    elif path.endswith(".jsonl") or path.endswith(".json"):
        kind = "jsonl"
    else:
        raise InputError(f"metrics file '{path}': the name must end in .csv, .jsonl or .json "
                         "(kat_train --metrics writes those)")
    with open(path, newline="", encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        raise InputError(f"metrics file '{path}' is empty: expected kat_train --metrics output, "
                         f"a CSV header '{HEADER}[,...]' and one line per epoch, or JSON lines")
    rows = []
    if kind == "csv":
        reader = csv.reader(text.splitlines())
        columns = [c.strip() for c in next(reader)]
        for number, fields in enumerate(reader, start=2):
            if not fields:
                continue
            if len(fields) != len(columns):
                raise InputError(f"metrics file '{path}', line {number}: {len(fields)} fields, "
                                 f"expected {len(columns)} (one per header column)")
            rows.append(dict(zip(columns, fields)))
    else:
        columns = None
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"metrics file '{path}', line {number}: not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise InputError(f"metrics file '{path}', line {number}: expected a JSON object, "
                                 f"got {type(record).__name__}")
            if columns is None:
                columns = list(record)
            rows.append(record)
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise InputError(f"metrics file '{path}' has no column '{missing[0]}' (expected the "
                         f"kat_train --metrics columns {', '.join(REQUIRED)}; the file has "
                         f"{', '.join(columns) if columns else 'none'})")
    if not rows:
        raise InputError(f"metrics file '{path}' has a header but no epoch rows")
    parsed = []
    for i, row in enumerate(rows):
        where = f"line {i + 2}" if kind == "csv" else f"record {i + 1}"
        values = {}
        for c in columns:
            if c not in row:
                raise InputError(f"metrics file '{path}', {where}: no value for column '{c}'")
            try:
                values[c] = float(row[c])
            except (TypeError, ValueError):
                raise InputError(f"metrics file '{path}', {where}: column '{c}' is "
                                 f"'{row[c]}', expected a number") from None
        parsed.append(values)
    return parsed, columns


def parse_run(argument):
    """'LABEL=FILE' or 'FILE' (a FILE whose name holds '=' is taken whole when it exists)."""
    if "=" in argument and not os.path.exists(argument):
        label, path = argument.split("=", 1)
        if not label or not path:
            raise InputError(f"run argument '{argument}': expected LABEL=FILE or FILE")
        return label, path
    name = os.path.basename(argument)
    return os.path.splitext(name)[0], argument


def parse_size(text):
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT in pixels, got '{text}'")
    if not (100 <= w <= 4000 and 100 <= h <= 4000):
        raise argparse.ArgumentTypeError(f"each side in [100, 4000] pixels, got '{text}'")
    return w, h


def main(argv):
    p = argparse.ArgumentParser(
        description="Training curves (loss, test accuracy) from kat_train --metrics files, as a PNG.")
    p.add_argument("runs", nargs="+", metavar="[LABEL=]FILE",
                   help="a kat_train --metrics file (.csv or .jsonl); LABEL names it in the legend")
    p.add_argument("--out", default="curves.png", help="the PNG to write (default curves.png)")
    p.add_argument("--title", default=None, help="the figure's title")
    p.add_argument("--x", choices=("epoch", "time", "both"), default="both",
                   help="against the epoch, the training seconds, or both side by side (default)")
    p.add_argument("--extra", action="append", default=[], metavar="COLUMN",
                   help="one more row for this column (e.g. density, internode_bytes); repeatable")
    p.add_argument("--log-y", action="store_true", help="logarithmic loss axis")
    p.add_argument("--size", type=parse_size, default=None, metavar="WxH",
                   help="image size in pixels (default: 1000 wide, 600 with one --x; 300 high "
                        "per row, plus 60)")
    p.add_argument("--dpi", type=int, default=100, help="dots per inch (default 100)")
    a = p.parse_args(argv)
    check_out(a.out)
    if not 50 <= a.dpi <= 600:
        raise InputError(f"--dpi: expected an integer in [50, 600], got {a.dpi}")

    runs = []
    for argument in a.runs:
        label, path = parse_run(argument)
        rows, columns = read_rows(path)
        for c in a.extra:
            if c not in columns:
                raise InputError(f"metrics file '{path}' has no column '{c}' (asked by --extra; "
                                 f"the file has {', '.join(columns)})")
        runs.append((label, path, rows))

    plt = pyplot()

    xs = ["epoch", "time"] if a.x == "both" else [a.x]
    panels = ["loss", "test_accuracy"] + a.extra
    width, height = a.size or (1000 if len(xs) == 2 else 600, 300 * len(panels) + 60)
    fig, axes = plt.subplots(len(panels), len(xs), figsize=(width / a.dpi, height / a.dpi),
                             dpi=a.dpi, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r, (label, path, rows) in enumerate(runs):
        color = colors[r % len(colors)]
        epochs = [row["epoch"] for row in rows]
        seconds, total = [], 0.0
        for row in rows:
            total += row["wall_seconds"]
            seconds.append(total)
        for j, x in enumerate(xs):
            xv = epochs if x == "epoch" else seconds
            for i, panel in enumerate(panels):
                ax = axes[i][j]
                if panel == "loss":
                    ax.plot(xv, [row["train_loss"] for row in rows], "-o", color=color,
                            markersize=3, label=f"{label} train")
                    ax.plot(xv, [row["test_loss"] for row in rows], "--s", color=color,
                            markersize=3, label=f"{label} test")
                elif panel == "test_accuracy":
                    ax.plot(xv, [100 * row["test_accuracy"] for row in rows], "-o", color=color,
                            markersize=3, label=label)
                else:
                    ax.plot(xv, [row[panel] for row in rows], "-o", color=color, markersize=3,
                            label=label)
    names = {"loss": "loss (train —, test - -)", "test_accuracy": "test accuracy (%)"}
    for i, panel in enumerate(panels):
        for j, x in enumerate(xs):
            ax = axes[i][j]
            ax.set_ylabel(names.get(panel, panel))
            ax.grid(True, alpha=0.3)
            if panel == "loss" and a.log_y:
                ax.set_yscale("log")
            if i == len(panels) - 1:
                ax.set_xlabel("epoch" if x == "epoch" else "training seconds (summed over epochs)")
            if x == "epoch":
                ax.xaxis.get_major_locator().set_params(integer=True)
    # One legend: the accuracy panel's, which has one entry per run.
    axes[1][0].legend(fontsize="small", loc="best")
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    save_png(plt, fig, a.out, a.dpi)
    print(f"plot_metrics.py: wrote {a.out} ({width}x{height} pixels, {len(runs)} run(s))")
    return 0


if __name__ == "__main__":
    run("plot_metrics.py", main)
