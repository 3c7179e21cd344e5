#!/usr/bin/env python3
"""Model-parallel against data-parallel FC layers under mpirun (issue 17): CaffeNet (the
deploy prototxt in shared/models) at --batch rows per rank, forward + full backward with
the gradients' allreduce overlapping backward as in training, timed by `hybridnn time
--json` on --ranks ranks twice in the same run: every layer data-parallel, then with
--layers (fc6,fc7,fc8) cut across the ranks (--model-parallel). Prints one JSON line per
mode with the bytes rank 0 sent per iteration (the allreduce's 2(R-1)/R of the gradients
as the ring sends them, and the cut layers' allgathers and reduce-scatters) and the time
per iteration, then one line of ratios, data-parallel over model-parallel:

  bytes_ratio     all bytes sent per iteration;
  fc_bytes_ratio  the FC layers' share alone: their gradients' allreduce (the difference
                  between the two runs' allreduce bytes) over the cut layers' collectives;
  time_ratio      ms per iteration (above 1: model-parallel is faster).

  bench/model_parallel.py [--ranks 2] [--batch 32] [--iterations 5] [--threads 1]
                          [--layers fc6,fc7,fc8] [--model PATH] [--build build]

Each rank runs --threads threads (ranks x threads should not exceed the cores). Open MPI
runs as root with OMPI_ALLOW_RUN_AS_ROOT; in containers without CMA add
--mca btl_vader_single_copy_mechanism none (done here).
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_time(args, extra):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("model_parallel.py: mpirun is not on PATH (apt-get install openmpi-bin)")
    command = [mpirun, "--oversubscribe", "--bind-to", "none", "--mca",
               "btl_vader_single_copy_mechanism", "none", "-np", str(args.ranks),
               str(pathlib.Path(args.build) / "bin" / "hybridnn"), "time", "--model", args.model,
               "--batch", str(args.batch), "--iterations", str(args.iterations), "--threads",
               str(args.threads), "--json"] + extra
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS=str(args.threads))
    print(f"# {' '.join(command)}", file=sys.stderr, flush=True)
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        sys.exit(f"model_parallel.py: `{' '.join(command)}` exited {run.returncode}:\n"
                 f"{run.stderr[-3000:]}")
    for line in run.stdout.splitlines():
        if line.startswith("{") and '"total":true' in line:
            return json.loads(line)
    sys.exit(f"model_parallel.py: no total line from hybridnn time:\n{run.stdout[-3000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", default="fc6,fc7,fc8")
    parser.add_argument("--model", default=str(
        ROOT.parent / "shared" / "models" / "bvlc_reference_caffenet_deploy.prototxt"))
    parser.add_argument("--build", default=str(ROOT / "build"))
    args = parser.parse_args()
    results = {}
    for mode, extra in (("data_parallel", []), ("model_parallel", ["--model-parallel",
                                                                   args.layers])):
        total = run_time(args, extra)
        results[mode] = total
        print(json.dumps({
            "bench": "model_parallel", "mode": mode, "model": pathlib.Path(args.model).name,
            "ranks": args.ranks, "batch_per_rank": args.batch, "threads": args.threads,
            "layers": args.layers if extra else "", "ms_per_iteration":
            total["forward_backward_ms"], "comm_bytes": total["comm_bytes"],
            "allreduce_sent_bytes": total["allreduce_sent_bytes"],
            "model_parallel_sent_bytes": total["model_parallel_sent_bytes"],
            "allreduce_ms": total["allreduce_ms"], "exposed_comm_ms": total["exposed_comm_ms"],
            "param_bytes": total["param_bytes"], "peak_rss_bytes": total["peak_rss_bytes"]}),
            flush=True)
    data, model = results["data_parallel"], results["model_parallel"]
    fc_data = data["allreduce_sent_bytes"] - model["allreduce_sent_bytes"]
    fc_model = model["model_parallel_sent_bytes"]
    print(json.dumps({
        "bench": "model_parallel", "ratios": "data_parallel / model_parallel",
        "bytes_ratio": data["comm_bytes"] / model["comm_bytes"],
        "fc_bytes_ratio": fc_data / fc_model if fc_model > 0 else None,
        "time_ratio": data["forward_backward_ms"] / model["forward_backward_ms"]}), flush=True)


if __name__ == "__main__":
    main()
