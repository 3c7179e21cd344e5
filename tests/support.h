// Test support: the driver configurations every op test runs on, device arrays filled from
// host vectors, random data, tolerant comparison and temporary directories.
#pragma once

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/memory.h"
#include "lib/core/runtime.h"
#include "lib/core/shapes.h"

namespace hn::test {

struct DriverConfig {
  std::string label;  // "reference", "reference (separate memory)", "cpu (1 thread)", ...
  Device device;
  DriverOptions options;
};

// Every driver configuration present on this machine: the reference driver in both memory
// modes, the CPU driver with 1 thread and with every core (each BLAS this build has), and
// cuda:N for every GPU. When no GPU answers, prints once, loudly, that the CUDA
// configurations are skipped.
std::vector<DriverConfig> driver_configs();

// A Buffer on a driver, filled from and read back to host vectors.
class DeviceArray {
 public:
  DeviceArray(Driver& driver, std::size_t count)
      : driver_(&driver), buffer_(driver, bytes(count)), count_(count) {}
  DeviceArray(Driver& driver, const std::vector<float>& values)
      : DeviceArray(driver, values.size()) {
    driver.copy_from_host(buffer_.address(), values.data(), bytes(count_));
  }
  float* data() const { return buffer_.as<float>(); }
  std::size_t size() const { return count_; }
  std::vector<float> host() const {
    std::vector<float> out(count_);
    driver_->copy_to_host(out.data(), buffer_.address(), bytes(count_));
    return out;
  }

 private:
  static std::size_t bytes(std::size_t count) { return count * sizeof(float); }
  Driver* driver_;
  Buffer buffer_;
  std::size_t count_;
};

// Whether `driver` computes BF16 products in BF16 math (its note says when it does not).
inline bool computes_bf16(const Driver& driver) {
  return driver.math_note(MathMode::bf16).find("computes FP32") == std::string::npos;
}

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v)
    x = dist(rng);
  return v;
}

// Parameter structs from positional sizes, for tables of test cases.
inline LoweringShape lowering(index_t batch, index_t channels, index_t height, index_t width,
                              index_t kernel_h, index_t kernel_w, index_t pad_h, index_t pad_w,
                              index_t stride_h, index_t stride_w, index_t dilation_h = 1,
                              index_t dilation_w = 1, index_t groups = 1) {
  LoweringShape s;
  s.batch = batch;
  s.channels = channels;
  s.height = height;
  s.width = width;
  s.kernel_h = kernel_h;
  s.kernel_w = kernel_w;
  s.pad_h = pad_h;
  s.pad_w = pad_w;
  s.stride_h = stride_h;
  s.stride_w = stride_w;
  s.dilation_h = dilation_h;
  s.dilation_w = dilation_w;
  s.groups = groups;
  return s;
}

inline PoolShape pooling(index_t batch, index_t channels, index_t height, index_t width,
                         index_t kernel_h, index_t kernel_w, index_t stride_h, index_t stride_w,
                         index_t pad_h, index_t pad_w) {
  PoolShape s;
  s.batch = batch;
  s.channels = channels;
  s.height = height;
  s.width = width;
  s.kernel_h = kernel_h;
  s.kernel_w = kernel_w;
  s.stride_h = stride_h;
  s.stride_w = stride_w;
  s.pad_h = pad_h;
  s.pad_w = pad_w;
  return s;
}

inline AxisShape axis(index_t outer, index_t channels, index_t inner) {
  AxisShape s;
  s.outer = outer;
  s.channels = channels;
  s.inner = inner;
  return s;
}

inline LrnShape lrn(index_t batch, index_t channels, index_t height, index_t width, index_t size,
                    LrnRegion region, float alpha = 1.0f, float beta = 0.75f, float k = 1.0f) {
  LrnShape s;
  s.batch = batch;
  s.channels = channels;
  s.height = height;
  s.width = width;
  s.size = size;
  s.region = region;
  s.alpha = alpha;
  s.beta = beta;
  s.k = k;
  return s;
}

// Largest |a - b| / max(1, |b|) over the elements; infinity when the sizes differ.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]) /
                     std::max(1.0, std::abs(static_cast<double>(b[i])));
    if (!(d <= worst)) worst = d;  // NaN propagates as a failure
  }
  return worst;
}

// A fresh directory under the system's temporary directory, removed with what it holds.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "hybridnn-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) throw Error("cannot create a directory " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Writes `text` to file `name` in the directory and returns its path.
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

// The hn::Error message `call` throws, or a note that it threw none. Other exception types
// propagate and fail the test.
template <class Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no hn::Error thrown)";
}

}  // namespace hn::test
