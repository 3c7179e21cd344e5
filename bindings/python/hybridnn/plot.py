"""Training curves from `hybridnn train --metrics FILE` (or `python -m hybridnn train
--metrics FILE`): the training loss, the test loss and the test accuracy against the
iteration, as Caffe's tools/extra/plot_training_log.py draws them.

    python3 -m hybridnn.plot METRICS.jsonl -o curve.png [--width 10 --height 4 --dpi 100]
"""
import argparse
import json
import sys


def read_metrics(path):
    """The train and test records of a metrics file: lists of (iter, loss, accuracy)."""
    train, test = [], []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not a JSON line: {error}") from None
            if "iter" not in record or "phase" not in record:
                raise ValueError(f"{path}:{number}: a metrics line needs 'iter' and 'phase'")
            point = (record["iter"], record.get("loss"), record.get("accuracy"))
            (train if record["phase"] == "train" else test).append(point)
    if not train and not test:
        raise ValueError(f"{path}: no metrics lines")
    return train, test


def plot(path, output, width=10.0, height=4.0, dpi=100):
    """Draws the curves of metrics file `path` into the PNG `output`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, test = read_metrics(path)
    figure, (losses, accuracy) = plt.subplots(1, 2, figsize=(width, height), dpi=dpi)
    for points, label in ((train, "train loss"), (test, "test loss")):
        shown = [(i, loss) for i, loss, _ in points if loss is not None]
        if shown:
            losses.plot(*zip(*shown), label=label, marker="." if label.startswith("test") else None)
    losses.set_xlabel("iteration")
    losses.set_ylabel("loss")
    losses.set_yscale("log")
    losses.legend()
    losses.grid(True, alpha=0.3)
    shown = [(i, a) for i, _, a in test if a is not None]
    if shown:
        accuracy.plot(*zip(*shown), marker=".", color="tab:green", label="test accuracy")
        accuracy.legend()
    accuracy.set_xlabel("iteration")
    accuracy.set_ylabel("accuracy")
    accuracy.grid(True, alpha=0.3)
    figure.suptitle(path)
    figure.tight_layout()
    # The size asked for, exactly: no bbox_inches="tight".
    figure.savefig(output, format="png", dpi=dpi)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m hybridnn.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics", help="a --metrics JSON-lines file")
    parser.add_argument("-o", "--output", required=True, help="the PNG to write")
    parser.add_argument("--width", type=float, default=10.0, help="inches (10)")
    parser.add_argument("--height", type=float, default=4.0, help="inches (4)")
    parser.add_argument("--dpi", type=int, default=100, help="pixels per inch (100)")
    args = parser.parse_args(argv)
    try:
        plot(args.metrics, args.output, args.width, args.height, args.dpi)
    except (OSError, ValueError) as error:
        print(f"hybridnn.plot: {error}", file=sys.stderr)
        return 1
    print(f"hybridnn.plot: wrote {args.output} ({int(args.width * args.dpi)}x"
          f"{int(args.height * args.dpi)} pixels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
