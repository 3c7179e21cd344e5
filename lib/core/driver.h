// The Driver interface: every piece of arithmetic a layer needs, on raw addresses in the
// driver's own memory space. One flat list of calls (driver_calls.def); small parameter
// structs (shapes.h). This is the header for those who write a driver; users of the
// library call the drivers the Runtime gives them.
//
// Each public call is non-virtual: it validates its arguments (sizes, leading dimensions,
// that every address lies in memory this driver may touch) and counts transfers, then
// calls the matching protected `do_*` virtual. So every driver reports misuse with the
// same hn::Error text, and a driver implements only the arithmetic.
//
// A new driver implements the core: the memory calls, synchronize and the HN_CORE calls
// (gemm, im2col/col2im, the basic element-wise calls and reductions: twenty in all). Every
// optional call has a generic implementation in lib/core/ that runs when the driver does
// not override it, built from the core calls; a driver overrides what it does faster.
//
// Calls may run asynchronously on the driver's stream; copy_to_host, the reductions that
// return a value, and synchronize() return with the work done. One driver instance
// serves one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "lib/core/device.h"
#include "lib/core/shapes.h"
#include "lib/core/solver_update.h"

namespace hn {

// What a driver is and which optional calls it does natively (the others run their generic
// implementations, driver_calls.def), for the layers' choice of algorithm.
struct Capabilities {
  bool host_addressable = false;  // computes directly on ordinary host memory
  bool convolution = false;       // conv_* natively: preferred over lowering to GEMM
  // conv_*, pool_*, lrn_*, scale_channels, bias_forward, bias_backward and norm_affine_*
  // take nChw16c and nChw8c operands (Layout in shapes.h); other drivers reject them with an
  // hn::Error.
  bool blocked_layout = false;
  // The blocked layout its kernels run on without reordering, which a Net keeps between
  // layers (NetOptions::blocked_layout): the CPU driver's is nChw16c with AVX-512, nChw8c
  // with AVX2 only (oneDNN's block, its vector width).
  Layout preferred_blocked_layout = Layout::nchw16c;
  // conv_* compute 3x3 stride-1 ungrouped convolutions with Winograd's algorithm where the
  // shape asks for it (LoweringShape::winograd), on NCHW and blocked operands alike.
  bool winograd = false;
  // conv_* compute 1x1 ungrouped unpadded convolutions with kernels of the driver's own where
  // the shape asks for it (LoweringShape::pointwise): any stride on operands in one blocked
  // layout, stride 1 on NCHW ones.
  bool pointwise = false;
  // conv_* round inside the call in the driver's present math mode (BF16 on a CPU with BF16
  // kernels) and compute FP32 where the shape asks for it (LoweringShape::fp32_kernel), so
  // the measured choice also times them in FP32.
  bool fp32_convolution = false;
};

// One piece of memory a call reads or writes (Driver::*_operands).
struct DriverOperand {
  enum class Use { read, write, update };  // update: read, then written
  const char* name = "";
  const void* address = nullptr;
  std::size_t bytes = 0;
  Use use = Use::read;
};

// A call's operands, and whether it has any work to do (false for empty sizes).
struct DriverOperands {
  static constexpr int kMax = 7;
  bool work = true;
  int count = 0;
  DriverOperand items[kMax];

  DriverOperands& add(const char* name, const void* address, std::size_t bytes,
                      DriverOperand::Use use);
  DriverOperands& read(const char* name, const void* address, std::size_t bytes) {
    return add(name, address, bytes, DriverOperand::Use::read);
  }
  DriverOperands& write(const char* name, const void* address, std::size_t bytes) {
    return add(name, address, bytes, DriverOperand::Use::write);
  }
  DriverOperands& update(const char* name, const void* address, std::size_t bytes) {
    return add(name, address, bytes, DriverOperand::Use::update);
  }
  static DriverOperands nothing() {
    DriverOperands none;
    none.work = false;
    return none;
  }
  const DriverOperand* begin() const { return items; }
  const DriverOperand* end() const { return items + count; }
};

// Transfers made through a driver, for tests and the scheduler's accounting; and the calls
// a steady-state iteration should not need: allocations and frees of the driver's memory
// (its own scratch included), and waits of the host for its work (synchronize(), and on a
// device a scalar result or a copy that must complete before the call returns).
struct TransferStats {
  std::uint64_t to_device = 0, to_device_bytes = 0;  // copy_from_host
  std::uint64_t to_host = 0, to_host_bytes = 0;      // copy_to_host
  std::uint64_t within = 0, within_bytes = 0;        // copy inside the driver's space
  std::uint64_t allocations = 0, frees = 0, waits = 0;
  std::uint64_t total() const { return to_device + to_host + within; }
};

// Identifies a memory space. Drivers that compute on host memory share host_space();
// a driver with memory of its own returns a space unique to itself.
using MemorySpace = const void*;
inline MemorySpace host_space() {
  return nullptr;
}

class Driver {
 public:
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  virtual ~Driver() = default;

  const Device& device() const { return device_; }
  std::string name() const { return device_.name(); }
  virtual Capabilities capabilities() const = 0;
  virtual MemorySpace memory_space() const = 0;
  bool can_address(MemorySpace space) const { return space == memory_space(); }
  // A one-line description for logs and device_query ("cpu: 2 threads, BLAS onednn").
  virtual std::string description() const { return name(); }
  // What a measured choice of algorithm may depend on, the tuning cache's key for this
  // driver (tune.h): description(), less what does not change which algorithm is fastest
  // (the CPU driver's cores and instance: cpu:1 bound in a split finds the choices cpu
  // made unbound).
  virtual std::string tuning_identity() const { return description(); }

  // ---- memory -------------------------------------------------------------------------
  // allocate(0) returns nullptr; deallocate(nullptr) does nothing.
  void* allocate(std::size_t bytes);
  void deallocate(void* address) noexcept;
  void copy_from_host(void* dst, const void* host_src, std::size_t bytes);
  void copy_to_host(void* host_dst, const void* src, std::size_t bytes);
  void copy(void* dst, const void* src, std::size_t bytes);  // within this driver's space
  void synchronize();
  // True when [address, address + bytes) lies in memory this driver may compute on.
  // Drivers that cannot tell return true; separate-memory drivers check their allocations.
  virtual bool owns(const void* address, std::size_t bytes) const = 0;
  const TransferStats& transfer_stats() const { return stats_; }
  void reset_transfer_stats() { stats_ = TransferStats{}; }

  // ---- math mode ------------------------------------------------------------------------
  // How the GEMMs and convolutions called from now on may round inside the call (MathMode,
  // shapes.h); a Net sets its own before each layer it runs. FP32 by default.
  void set_math_mode(MathMode mode) { math_mode_ = mode; }
  MathMode math_mode() const { return math_mode_; }
  // Empty when this driver computes `mode` as asked; else one line saying what it computes
  // instead and why ("computes FP32: this CPU has no AVX512_BF16 or AMX").
  virtual std::string math_note(MathMode mode) const;

  // ---- timing on the driver's queue ----------------------------------------------------
  // Marks recorded between calls as they are queued and read once the work is done: the
  // time between two marks is the device's time for the calls between them, with no wait
  // after each call (hybridnn time's per-layer table on a GPU). A driver whose calls return
  // with their work done has none (host timers measure those): make_marks returns nullptr.
  class Marks {
   public:
    virtual ~Marks() = default;
    virtual int count() const = 0;
    // Records mark `mark` (in [0, count())) after the calls queued so far.
    virtual void record(int mark) = 0;
    // Milliseconds between two recorded marks, once synchronize() has returned.
    virtual double elapsed_ms(int from, int to) const = 0;
  };
  virtual std::unique_ptr<Marks> make_marks(int count);

  // ---- recordings: calls queued once, replayed as one launch ----------------------------
  // A driver that queues its calls (a GPU's stream) can record the calls made between
  // begin_recording() and end_recording() instead of running them, and replay them all as
  // one launch (a CUDA graph): the same kernels on the same addresses with the same
  // arguments, so only for work whose memory and arguments stay fixed (a net's iteration,
  // its memory plan made). A call that waits for the device, copies through the host or
  // allocates cannot be recorded: it throws, and end_recording() then fails. Both return
  // false / nullptr with the reason in `why` where nothing was recorded (a driver whose calls
  // run as they are made records nothing); nothing recorded has run.
  class Recording {
   public:
    virtual ~Recording() = default;
    virtual void replay() = 0;  // queues the recorded calls once more
  };
  virtual bool records() const { return false; }
  virtual bool begin_recording(std::string& why);
  virtual std::unique_ptr<Recording> end_recording(std::string& why);

  // ---- compute calls: the list, with each call's contract, is driver_calls.def ---------
#define HN_CORE(RET, NAME, PARAMS, ARGS) RET NAME PARAMS;
#define HN_OPTIONAL HN_CORE
#include "lib/core/driver_calls.def"

  // The memory a call with these arguments reads and writes, after checking its sizes and
  // settings (hn::Error naming the call otherwise). Every public call checks its operands
  // against owns() with it; the generic implementations stage them.
#define HN_CORE(RET, NAME, PARAMS, ARGS) DriverOperands NAME##_operands PARAMS const;
#define HN_OPTIONAL HN_CORE
#include "lib/core/driver_calls.def"

 protected:
  explicit Driver(Device device) : device_(device) {}

  virtual void* do_allocate(std::size_t bytes) = 0;
  virtual void do_deallocate(void* address) noexcept = 0;
  virtual void do_copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void do_copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void do_copy(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void do_synchronize() = 0;

  // Core calls: every driver implements them. Optional calls: the defaults run the generic
  // implementation (driver_calls.def says which kind), so a driver overrides only what it
  // does faster.
#define HN_CORE(RET, NAME, PARAMS, ARGS) virtual RET do_##NAME PARAMS = 0;
#define HN_OPTIONAL(RET, NAME, PARAMS, ARGS) virtual RET do_##NAME PARAMS;
#include "lib/core/driver_calls.def"

  // Around every compute call of driver_calls.def (its public wrapper, after the operands'
  // checks): a driver that sets per-thread state for its calls (the CPU driver flushing
  // denormals) sets it in enter_call and restores it in leave_call, which runs whether the
  // call returns or throws. Calls made from inside a call (none of the built-in drivers'
  // do) enter and leave again, nested.
  virtual void enter_call() {}
  virtual void leave_call() noexcept {}

  // For the driver's own allocations and waits outside allocate() and synchronize().
  void count_allocation() {
    ++stats_.allocations;
  }
  void count_wait() {
    ++stats_.waits;
  }

 private:
  class CallScope;  // enter_call() ... leave_call() (driver.cpp)

  // Throws hn::Error when [address, address + bytes) is not memory this driver owns.
  void check_range(const char* call, const char* argument, const void* address,
                   std::size_t bytes) const;

  Device device_;
  TransferStats stats_;
  MathMode math_mode_ = MathMode::fp32;
};

// y = activation(y) in place on n floats of `driver`'s memory, through its relu_forward or
// clip_forward (nothing for Activation::Kind::none): conv_forward_activation's second half
// where a driver or an algorithm does not fuse it.
void apply_activation(Driver& driver, index_t n, const Activation& activation, float* y);
// y = activation(y + residual) in place, as two calls (lincomb_relu, or lincomb then
// apply_activation): conv_forward_residual's second half where a driver has no fused form.
void add_activate(Driver& driver, index_t n, const float* residual, const Activation& activation,
                  float* y);

}  // namespace hn
