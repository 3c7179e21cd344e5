// The `nccl` backend (built with MPI, CUDA and NCCL): ncclAllReduce on device buffers, the
// bytes carried by NCCL between GPUs (NVLink, PCIe, InfiniBand), MPI only bootstrapping it
// (rank 0's ncclUniqueId is broadcast over MPI) and running the other collectives.
//
// Each rank uses GPU (local rank % GPUs on its node) unless the buffers it is handed live on
// another GPU, which is an error naming both. Buffers in host memory (a CPU driver's) are
// staged through a device buffer. Every allreduce waits at most the deadline, polling its
// stream and ncclCommGetAsyncError; past it the NCCL communicator is aborted
// (ncclCommAbort) and the error names the collective and the rank, as the other backends.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <thread>

#include "lib/comm/mpi.h"
#include "lib/comm/mpi_communicator.h"
#include "lib/core/check.h"

namespace hn::detail {

namespace {

void check_cuda(cudaError_t code, const char* call) {
  if (code != cudaSuccess) {
    throw CommunicatorError(
        fmt::format("communicator nccl: {} failed: {}", call, cudaGetErrorString(code)));
  }
}

void check_nccl(ncclResult_t code, const char* call) {
  if (code != ncclSuccess && code != ncclInProgress) {
    throw CommunicatorError(
        fmt::format("communicator nccl: {} failed: {}", call, ncclGetErrorString(code)));
  }
}

int local_rank() {
  return launcher_value(
      {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"}, 0, 0);
}

class NcclCommunicator final : public MpiCommunicator {
 public:
  explicit NcclCommunicator(const CommOptions& options) : MpiCommunicator(options, "nccl") {
    int devices = 0;
    check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    HN_CHECK(devices > 0, "communicator nccl: rank {} of {} sees no CUDA device", rank_, size_);
    device_ = local_rank() % devices;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id{};
    if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::vector<MPI_Request> request(1);
    check_mpi(MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, comm_, request.data()), "MPI_Ibcast");
    wait_all(request, "nccl bootstrap", 0);
    check_nccl(ncclCommInitRank(&nccl_, size_, id, rank_), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    if (staging_ != nullptr) cudaFree(staging_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (nccl_ != nullptr) ncclCommDestroy(nccl_);
  }

  std::string name() const override { return "nccl"; }

  void allreduce(Driver& driver, float* data, std::size_t count, ReduceOp op) override {
    const std::uint64_t seq = next_sequence();
    agree_count("allreduce", seq, count);
    if (count == 0) return;
    driver.synchronize();  // the gradients are final on the driver's stream
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    float* device_data = data;
    const bool host = driver.capabilities().host_addressable;
    if (host) {
      reserve(count);
      check_cuda(
          cudaMemcpyAsync(staging_, data, count * sizeof(float), cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync");
      device_data = staging_;
    } else {
      cudaPointerAttributes attributes{};
      check_cuda(cudaPointerGetAttributes(&attributes, data), "cudaPointerGetAttributes");
      HN_CHECK(attributes.device == device_,
               "communicator nccl: rank {} runs NCCL on GPU {} but was handed memory of GPU {}; "
               "give each rank the GPU of its local rank",
               rank_, device_, attributes.device);
    }
    check_nccl(ncclAllReduce(device_data, device_data, count, ncclFloat,
                             op == ReduceOp::average ? ncclAvg : ncclSum, nccl_, stream_),
               "ncclAllReduce");
    if (host) {
      check_cuda(
          cudaMemcpyAsync(data, staging_, count * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    }
    wait_stream("allreduce", seq);
  }

 private:
  void reserve(std::size_t count) {
    if (count <= staging_count_) return;
    if (staging_ != nullptr) check_cuda(cudaFree(staging_), "cudaFree");
    staging_ = nullptr;
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&staging_), count * sizeof(float)),
               "cudaMalloc");
    staging_count_ = count;
  }

  // Polls the stream until the collective is done, NCCL reports an error, or the deadline.
  void wait_stream(const char* what, std::uint64_t seq) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.timeout_seconds);
    for (;;) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) check_cuda(state, "cudaStreamQuery");
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(nccl_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        ncclCommAbort(nccl_);
        nccl_ = nullptr;
        throw CommunicatorError(fmt::format("communicator nccl: {} #{} on rank {} of {} failed: {}",
                                            what, seq, rank_, size_, ncclGetErrorString(async)));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(nccl_);
        nccl_ = nullptr;
        timed_out(what, seq, -1);
      }
      std::this_thread::yield();
    }
  }

  int device_ = 0;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* staging_ = nullptr;
  std::size_t staging_count_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const CommOptions& options) {
  return std::make_unique<NcclCommunicator>(options);
}

}  // namespace hn::detail
