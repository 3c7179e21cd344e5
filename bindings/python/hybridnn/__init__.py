"""hybridnn: Caffe nets on CPU and GPU drivers, every layer's batch split among them and
merged exactly, with a ring allreduce across processes.

The bindings call libhybridnn's C ABI. numpy arrays go in and out without copies:
``Tensor.wrap(array)`` computes on the array's own memory, and ``tensor.data`` /
``tensor.diff`` are numpy views of the library's memory.

    import hybridnn as hn
    runtime = hn.Runtime()
    cpu = runtime.add("cpu")
    net = hn.Net(runtime, cpu, "deploy.prototxt", phase="test", weights="net.caffemodel")
    net.blob("data").data[...] = images
    net.forward()
    probabilities = net.blob("prob").data
"""
from ._core import (  # noqa: F401
    Communicator,
    Driver,
    Error,
    Layer,
    Net,
    Runtime,
    Solver,
    Tensor,
    abi_version,
    available_devices,
    memory_limit,
    peak_resident_memory,
    set_memory_limit,
    version,
)

__version__ = version()
__all__ = ["Communicator", "Driver", "Error", "Layer", "Net", "Runtime", "Solver", "Tensor",
           "abi_version", "available_devices", "memory_limit", "peak_resident_memory",
           "set_memory_limit", "version"]
