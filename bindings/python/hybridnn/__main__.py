"""python3 -m hybridnn COMMAND: the hybridnn tool's commands on the Python bindings.

  train         --solver FILE [--weights W | --snapshot S] [--device D] [--split SPEC]
                [--max-iter N] [--train-data SRC] [--test-data SRC] [--metrics FILE]
                [--threads N]
  test          --model FILE --weights W [--iterations N] [--device D] [--data SRC]
  time          --model FILE [--iterations N] [--batch B] [--device D]
  device_query  the devices of this machine and build
"""
import argparse
import json
import math
import signal
import sys
import time

from . import Error, Net, Runtime, Solver, available_devices, version


def driver_for(runtime, args):
    options = f"threads={args.threads}" if getattr(args, "threads", None) else ""
    return runtime.add(args.device, options if args.device.startswith("cpu") else "")


def json_number(value):
    return "null" if value is None or not math.isfinite(value) else repr(float(value))


def train(args):
    runtime = Runtime()
    driver = driver_for(runtime, args)
    options = {}
    for key in ("split", "max_iter", "train_data", "test_data"):
        value = getattr(args, key)
        if value is not None:
            options[key] = value
    solver = Solver(runtime, driver, args.solver, **options)
    if args.weights:
        solver.copy_weights(args.weights)
    if args.snapshot:
        solver.restore(args.snapshot)
    metrics = open(args.metrics, "w", encoding="utf-8") if args.metrics else None

    def on_event(event):
        if event["kind"] == "snapshot":
            print(f"Snapshotting to binary proto file {event['snapshot']}", flush=True)
            return
        train_phase = event["kind"] == "train"
        if train_phase:
            speed = f", {event['images_per_s']:.0f} images/s" if event["images_per_s"] > 0 else ""
            print(f"Iteration {event['iter']}, loss = {event['loss']:.6g}, "
                  f"lr = {event['lr']:.6g}{speed}", flush=True)
        else:
            print(f"Iteration {event['iter']}, Testing net (#{event['test_net']})", flush=True)
        for index, (name, value) in enumerate(event["outputs"].items()):
            print(f"    {'Train' if train_phase else 'Test'} net output #{index}: "
                  f"{name} = {value:.6g}", flush=True)
        if metrics:
            accuracy = next((v for k, v in event["outputs"].items() if k.startswith("accuracy")),
                            None)
            metrics.write(json.dumps({
                "iter": event["iter"], "phase": "train" if train_phase else "test",
                "loss": event["loss"], "accuracy": accuracy, "lr": event["lr"],
                "images_per_s": event["images_per_s"] or None}) + "\n")
            metrics.flush()

    solver.on_event(on_event)
    previous = signal.signal(signal.SIGINT, lambda *_: solver.request_stop())
    try:
        print(f"Solving {args.solver} on {driver.name} (hybridnn {version()})", flush=True)
        solver.solve()
    finally:
        signal.signal(signal.SIGINT, previous)
        if metrics:
            metrics.close()
    print("Optimization Done.")
    return 0


def test(args):
    runtime = Runtime()
    driver = driver_for(runtime, args)
    options = {"phase": "test", "weights": args.weights}
    if args.data:
        options["data"] = args.data
    net = Net(runtime, driver, args.model, **options)
    outputs = net.outputs
    sums = dict.fromkeys(outputs, 0.0)
    for batch in range(args.iterations):
        loss = net.forward()
        for name in outputs:
            values = net.blob(name).data
            value = float(values.mean()) if values.size != 1 else float(values.reshape(-1)[0])
            sums[name] += value
            print(f"Batch {batch}, {name} = {value:.6g}")
        del loss
    for name in outputs:
        print(f"{name} = {sums[name] / args.iterations:.6g}")
    return 0


def time_net(args):
    runtime = Runtime()
    driver = driver_for(runtime, args)
    options = {"force_backward": True}
    if args.batch:
        options["batch"] = args.batch
    net = Net(runtime, driver, args.model, **options)
    net.forward()
    net.backward()  # warm-up
    forward = backward = 0.0
    for _ in range(args.iterations):
        start = time.perf_counter()
        net.forward()
        middle = time.perf_counter()
        net.backward()
        forward += middle - start
        backward += time.perf_counter() - middle
    n = args.iterations
    print(f"Average Forward pass: {1e3 * forward / n:.3f} ms.")
    print(f"Average Backward pass: {1e3 * backward / n:.3f} ms.")
    print(f"Average Forward-Backward: {1e3 * (forward + backward) / n:.3f} ms.")
    return 0


def device_query(_args):
    runtime = Runtime()
    for device in available_devices():
        print(f"{device}: {runtime.add(device).description}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m hybridnn", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("train", help="train with a solver")
    p.add_argument("--solver", required=True)
    p.add_argument("--weights", help="finetune from these .caffemodel files (a,b)")
    p.add_argument("--snapshot", help="resume from this .solverstate")
    p.add_argument("--split")
    p.add_argument("--max-iter", dest="max_iter", type=int)
    p.add_argument("--train-data", dest="train_data")
    p.add_argument("--test-data", dest="test_data")
    p.add_argument("--metrics", help="write one JSON line per display and test")
    p.set_defaults(run=train)
    p = commands.add_parser("test", help="score a trained model")
    p.add_argument("--model", required=True)
    p.add_argument("--weights", required=True)
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--data")
    p.set_defaults(run=test)
    p = commands.add_parser("time", help="time forward and backward")
    p.add_argument("--model", required=True)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--batch", type=int)
    p.set_defaults(run=time_net)
    p = commands.add_parser("device_query", help="list the devices")
    p.set_defaults(run=device_query)
    for sub in commands.choices.values():
        sub.add_argument("--device", default="cpu", help="cpu (default), reference, cuda:N")
        sub.add_argument("--threads", type=int, help="CPU driver threads (default: every core)")
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (Error, OSError, ValueError) as error:
        print(f"hybridnn: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
