// DeviceWorker: the long-lived host thread that issues one driver's slices of split layers
// (RuntimeThreads::of). A driver serves one thread at a time (driver.h); giving each
// driver its own thread for the life of the Runtime lets the slices of a layer run at the
// same time without a thread per call, and keeps per-thread runtime state (OpenMP teams,
// CUDA contexts) warm.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "lib/core/affinity.h"
#include "lib/core/runtime.h"

namespace hn::detail {

class DeviceWorker {
 public:
  DeviceWorker()
      : thread_([this] {
          mark_library_thread();
          loop();
        }) {}
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;
  ~DeviceWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }

  // Starts `task` on the worker's thread. The previous task must have been waited for.
  void submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = std::move(task);
      busy_ = true;
      error_ = nullptr;
    }
    wake_.notify_one();
  }

  // Blocks until the task submitted last has finished; returns what it threw (or null).
  std::exception_ptr wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return !busy_; });
    return std::exchange(error_, nullptr);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || (busy_ && task_); });
      if (stop_) return;
      std::function<void()> task = std::move(task_);
      task_ = nullptr;
      lock.unlock();
      std::exception_ptr error;
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      busy_ = false;
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void()> task_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the members above exist
};

// The long-lived host thread that issues `driver`'s slices of split layers, one per driver
// of a Runtime, started at the first call and joined with the Runtime.
struct RuntimeThreads {
  static DeviceWorker& of(Runtime& runtime, Driver& driver) {
    return runtime.device_thread(driver);
  }
};

}  // namespace hn::detail
