"""python3 -m hybridnn (the tool's commands) and python3 -m hybridnn.plot."""
import json
import signal
import struct
import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          check=False)


def png_size(path):
    """(width, height) from a PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_device_query():
    result = run("hybridnn", "device_query")
    assert result.returncode == 0, result.stderr
    assert "cpu:" in result.stdout and "reference:" in result.stdout


def test_train_writes_metrics_and_plot_draws_them(tiny_solver, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    result = run("hybridnn", "train", "--solver", str(tiny_solver), "--max-iter", "20",
                 "--metrics", str(metrics), "--threads", "1")
    assert result.returncode == 0, result.stderr
    assert "Iteration 15, loss = " in result.stdout
    assert "Optimization Done" in result.stdout
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["iter"] for r in records if r["phase"] == "train"] == [0, 5, 10, 15, 20]
    assert records[-1]["loss"] < records[0]["loss"]
    assert (tmp_path / "tiny_iter_20.caffemodel").exists()

    # A test record with an accuracy, as a solver with a test net writes.
    with metrics.open("a") as file:
        file.write(json.dumps({"iter": 20, "phase": "test", "loss": 0.2, "accuracy": 0.9,
                               "lr": None, "images_per_s": None}) + "\n")
    png = tmp_path / "curve.png"
    result = run("hybridnn.plot", str(metrics), "-o", str(png), "--width", "8", "--height", "3",
                 "--dpi", "50")
    assert result.returncode == 0, result.stderr
    assert png_size(png) == (400, 150)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"iter": 1, "phase": "train", "loss": 1}\nnot json\n')
    result = run("hybridnn.plot", str(bad), "-o", str(tmp_path / "x.png"))
    assert result.returncode == 1
    assert "bad.jsonl:2" in result.stderr


def test_train_reports_a_missing_solver(tmp_path):
    result = run("hybridnn", "train", "--solver", str(tmp_path / "none.prototxt"))
    assert result.returncode == 1
    assert "none.prototxt" in result.stderr


@pytest.mark.parametrize("command", ["test", "time"])
def test_commands_need_a_model(command):
    result = run("hybridnn", command)
    assert result.returncode == 2
    assert "--model" in result.stderr


def test_time_is_the_tools_own_command(tiny_solver):
    # The executable's flags and JSON lines (python -m hybridnn once had a copy of its own
    # with neither --json nor --split).
    net = tiny_solver.parent / "net.prototxt"
    result = run("hybridnn", "time", "--model", str(net), "--iterations", "2", "--json",
                 "--split", "cpu:0.5,reference:0.5", "--tune", "off")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines[-1]["total"] is True
    assert lines[-1]["split_spec"] == "cpu:0.5,reference:0.5"
    assert {line.get("layer") for line in lines} >= {"ip", "loss"}


def test_tool_in_process_gives_back_pythons_signal_handlers(tiny_solver):
    from hybridnn import __main__ as tool

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert tool.main(["train", "--solver", str(tiny_solver), "--max-iter", "2",
                      "--threads", "1"]) == 0
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert tool.main(["train", "--solver", str(tiny_solver), "--no-such-flag"]) == 2
