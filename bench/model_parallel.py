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

  bench/model_parallel.py [--ranks 2] [--batch 32] [--iterations 5] [--repeats 3]
                          [--threads 1] [--layers fc6,fc7,fc8] [--model PATH] [--build build]

The two modes run --repeats times each, alternating, and each reports its fastest run (the
machine is shared; the fastest run is the least disturbed); every run's time is listed too.

Each rank runs --threads threads (ranks x threads should not exceed the cores). Open MPI
runs as root with OMPI_ALLOW_RUN_AS_ROOT; in containers without CMA add
--mca btl_vader_single_copy_mechanism none (done here).

--link RATE (e.g. 1gbit, 10gbit; root, iproute2) runs the 2 ranks on two simulated nodes
instead of over shared memory: two network namespaces joined by a veth pair shaped with tc
netem to RATE and 100 us of delay, mpirun in the first reaching the second through
tests/mpi/netns_rsh_agent.sh over TCP, as the tool test mpi_two_simulated_nodes does (a
tbf rate limit alone where the kernel has no netem).
"""
import argparse
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


class SimulatedNodes:
    """Two network namespaces joined by a veth pair shaped to `rate` (tc netem)."""

    A, B = "10.78.0.1", "10.78.0.2"

    def __init__(self, rate, work):
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"hb{tag}a", f"hb{tag}b")
        self.veth = (f"hw{tag}a", f"hw{tag}b")
        self.rate, self.work = rate, work
        self.shaping = ""

    @staticmethod
    def sh(*command):
        run = subprocess.run(list(command), capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` exited {run.returncode}: {run.stderr}")

    def __enter__(self):
        try:
            for ns in self.ns:
                self.sh("ip", "netns", "add", ns)
            self.sh("ip", "link", "add", self.veth[0], "netns", self.ns[0], "type", "veth", "peer",
                    "name", self.veth[1], "netns", self.ns[1])
            for ns, veth, address in zip(self.ns, self.veth, (self.A, self.B)):
                self.sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", veth)
                self.sh("ip", "-n", ns, "link", "set", veth, "up")
                self.sh("ip", "-n", ns, "link", "set", "lo", "up")
                try:
                    self.sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", veth, "root",
                            "netem", "delay", "100us", "rate", self.rate, "limit", "100000")
                    self.shaping = f"netem {self.rate}, 100 us"
                except RuntimeError:  # a kernel without netem: a rate limit alone
                    self.sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", veth, "root",
                            "tbf", "rate", self.rate, "burst", "1mb", "latency", "10ms")
                    self.shaping = f"tbf {self.rate} (no netem in this kernel: no added delay)"
            print(f"# simulated nodes: {self.shaping}", file=sys.stderr, flush=True)
        except BaseException as error:
            self.__exit__()
            sys.exit(f"model_parallel.py: cannot simulate two nodes here: {error}")
        return self

    def __exit__(self, *exc):
        for ns in self.ns:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def prefix(self, mpirun):
        hosts = os.path.join(self.work, "hosts")
        with open(hosts, "w") as f:
            f.write(f"{self.A} slots=1\n{self.B} slots=1\n")
        agent = str(ROOT / "tests" / "mpi" / "netns_rsh_agent.sh")
        return ["ip", "netns", "exec", self.ns[0], mpirun, "--hostfile", hosts, "-np", "2",
                "--mca", "plm_rsh_agent", agent, "--mca", "btl", "self,tcp", "--mca",
                "btl_tcp_if_include", "10.78.0.0/24", "--mca", "oob_tcp_if_include",
                "10.78.0.0/24", "--bind-to", "none", "-x", "OMP_NUM_THREADS"]


def run_time(args, extra, nodes=None):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("model_parallel.py: mpirun is not on PATH (apt-get install openmpi-bin)")
    launcher = (nodes.prefix(mpirun) if nodes else
                [mpirun, "--oversubscribe", "--bind-to", "none", "--mca",
                 "btl_vader_single_copy_mechanism", "none", "-np", str(args.ranks)])
    command = launcher + [
        str(pathlib.Path(args.build) / "bin" / "hybridnn"), "time", "--model", args.model,
        "--batch", str(args.batch), "--iterations", str(args.iterations), "--threads",
        str(args.threads), "--json"] + extra
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS=str(args.threads))
    if nodes:
        env["HN_NETNS_MAP"] = f"{nodes.A}={nodes.ns[0]} {nodes.B}={nodes.ns[1]}"
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--link", default="")
    args = parser.parse_args()
    if args.link and args.ranks != 2:
        sys.exit("model_parallel.py: --link simulates two nodes: give --ranks 2")
    modes = (("data_parallel", []), ("model_parallel", ["--model-parallel", args.layers]))
    runs = {mode: [] for mode, _ in modes}
    with tempfile.TemporaryDirectory() as work:
        nodes = SimulatedNodes(args.link, work) if args.link else None
        with nodes if nodes else contextlib.nullcontext():
            for _ in range(args.repeats):
                for mode, extra in modes:
                    runs[mode].append(run_time(args, extra, nodes))
    results = {}
    for mode, extra in modes:
        total = min(runs[mode], key=lambda run: run["forward_backward_ms"])
        results[mode] = total
        print(json.dumps({
            "bench": "model_parallel", "mode": mode, "model": pathlib.Path(args.model).name,
            "ranks": args.ranks, "link": args.link or "shared memory",
            "batch_per_rank": args.batch, "threads": args.threads,
            "layers": args.layers if extra else "", "ms_per_iteration":
            total["forward_backward_ms"],
            "ms_per_iteration_runs": [run["forward_backward_ms"] for run in runs[mode]],
            "comm_bytes": total["comm_bytes"],
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
