"""What scripts/plot_metrics.py and scripts/plot_epoch_times.py share: the error type, the check
of --out before any work, matplotlib without a display, the checked write of the PNG, and the
exit codes (2: bad input, 1: the system refused a read or a write)."""

import os
import sys

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class InputError(Exception):
    """Bad input: the message names the file or option, what was expected and what was found."""


def check_out(out):
    """Refuses an --out that is not a .png in an existing directory, before anything is read."""
    if not out.endswith(".png"):
        raise InputError(f"--out: the file name must end in .png, got '{out}'")
    out_dir = os.path.dirname(out) or "."
    if not os.path.isdir(out_dir):
        raise InputError(f"--out: the directory '{out_dir}' of '{out}' does not exist")


def pyplot():
    """matplotlib.pyplot with the Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_png(plt, fig, out, dpi):
    """Writes `fig` to `out` and checks that what landed there is a PNG."""
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    with open(out, "rb") as f:
        head = f.read(8)
    if head != PNG_SIGNATURE:
        raise InputError(f"--out: '{out}' was written but does not start with a PNG signature")


def run(name, main):
    """Runs main(sys.argv[1:]) and exits with its status, 2 on InputError, 1 on OSError, each
    with one line 'NAME: error: ...' on standard error."""
    try:
        sys.exit(main(sys.argv[1:]))
    except InputError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(1)
