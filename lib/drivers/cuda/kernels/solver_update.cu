// Launcher of the fused solver_update kernel (one thread per parameter).
#include "lib/drivers/cuda/kernels/launchers.h"
#include "lib/drivers/cuda/kernels/solver_update.cuh"
#include "lib/drivers/cuda/launch.cuh"

namespace hn::detail::cuda {

namespace {

struct SolverUpdateBody {
  SolverUpdate u;
  float* param;
  const float* grad;
  float* history;
  float* history2;
  __device__ void operator()(index_t i) const {
    solver_update_element(i, u, param, grad, history, history2);
  }
};

}  // namespace

cudaError_t launch_solver_update(cudaStream_t stream, const SolverUpdate& u, index_t n,
                                 float* param, const float* grad, float* history, float* history2) {
  return launch_for_each(stream, n, SolverUpdateBody{u, param, grad, history, history2});
}

}  // namespace hn::detail::cuda
