// Driver::solver_update: the reference against Caffe's solver code transcribed array operation
// by array operation (and a few values worked out by hand), every driver configuration
// against the reference for every rule, regularisation and gradient scale, and the misuse
// errors of the validating front.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridnn/error.h"
#include "lib/core/driver.h"
#include "lib/core/memory.h"
#include "lib/core/runtime.h"
#include "lib/core/shapes.h"
#include "tests/core_driver.h"
#include "tests/support.h"

namespace {

using Catch::Matchers::Contains;
using hn::index_t;
using hn::SolverUpdate;
using hn::UpdateType;
using hn::test::DeviceArray;
using hn::test::DriverConfig;
using hn::test::error_of;
using hn::test::max_rel_diff;
using hn::test::random_floats;

const UpdateType kTypes[] = {UpdateType::sgd,     UpdateType::nesterov, UpdateType::adagrad,
                             UpdateType::rmsprop, UpdateType::adadelta, UpdateType::adam};

// Each rule with settings like the ones Caffe's examples use.
SolverUpdate settings_for(UpdateType type) {
  SolverUpdate u;
  u.type = type;
  u.lr = 0.01f;
  switch (type) {
    case UpdateType::sgd:
    case UpdateType::nesterov:
      u.momentum = 0.9f;
      break;
    case UpdateType::adagrad:
      u.delta = 1e-7f;
      break;
    case UpdateType::rmsprop:
      u.rms_decay = 0.98f;
      u.delta = 1e-6f;
      break;
    case UpdateType::adadelta:
      u.momentum = 0.95f;
      u.delta = 1e-6f;
      u.lr = 1.0f;
      break;
    case UpdateType::adam:
      u.momentum = 0.9f;
      u.momentum2 = 0.999f;
      // Caffe folds the bias correction of step t = 1 into the rate.
      u.lr = 0.001f * std::sqrt(1.0f - 0.999f) / (1.0f - 0.9f);
      break;
  }
  return u;
}

// Starting histories: signed for momentum-like histories, non-negative for the running
// squares that the rules take square roots of.
bool history_is_signed(UpdateType type) {
  return type == UpdateType::sgd || type == UpdateType::nesterov || type == UpdateType::adam;
}

struct State {
  std::vector<float> param, history, history2;
};

State random_state(UpdateType type, std::size_t n, std::uint32_t seed) {
  State s;
  s.param = random_floats(n, seed, -1.0f, 1.0f);
  for (std::size_t i = 0; i < n; i += 7)
    s.param[i] = 0.0f;  // sign(0) = 0 for L1
  s.history = history_is_signed(type) ? random_floats(n, seed + 1, -0.1f, 0.1f)
                                      : random_floats(n, seed + 1, 0.0f, 0.5f);
  s.history2 = random_floats(n, seed + 2, 0.0f, 0.5f);
  return s;
}

// ---- Caffe's CPU solver path, transcribed (float, one array operation at a time) -------
// SGDSolver::ClipGradients scales the diff, Normalize multiplies it by 1 / iter_size,
// Regularize adds decay * w (L2) or decay * sign(w) (L1) with caffe_axpy, each solver's
// ComputeUpdateValue leaves the update in the diff, and Net::Update subtracts it.

void axpby(float alpha, const std::vector<float>& x, float beta, std::vector<float>& y) {
  for (std::size_t i = 0; i < y.size(); ++i)
    y[i] = alpha * x[i] + beta * y[i];
}

void caffe_step(const SolverUpdate& u, float clip_scale, int iter_size, State& s,
                std::vector<float> diff) {
  const std::size_t n = diff.size();
  for (float& d : diff)
    d *= clip_scale;
  const float normalization = 1.0f / static_cast<float>(iter_size);
  if (iter_size != 1) {
    for (float& d : diff)
      d *= normalization;
  }
  if (u.decay != 0.0f) {
    for (std::size_t i = 0; i < n; ++i) {
      const float w = s.param[i];
      const float sign = static_cast<float>((0.0f < w) - (w < 0.0f));
      diff[i] += u.decay * (u.l1 ? sign : w);
    }
  }
  std::vector<float> update(n), temp(n);
  std::vector<float>& h = s.history;
  std::vector<float>& h2 = s.history2;
  switch (u.type) {
    case UpdateType::sgd:  // caffe_cpu_axpby(lr, diff, momentum, h); copy h to diff
      axpby(u.lr, diff, u.momentum, h);
      diff = h;
      break;
    case UpdateType::nesterov:  // update = h; h = lr diff + m h; diff = (1+m) h - m update
      update = h;
      axpby(u.lr, diff, u.momentum, h);
      axpby(1.0f + u.momentum, h, -u.momentum, update);
      diff = update;
      break;
    case UpdateType::adagrad:  // h += diff^2; diff = lr * diff / (sqrt(h) + delta)
      for (std::size_t i = 0; i < n; ++i) {
        update[i] = std::pow(diff[i], 2.0f);
        h[i] = update[i] + h[i];
        update[i] = std::pow(h[i], 0.5f) + u.delta;
        update[i] = diff[i] / update[i];
        diff[i] = u.lr * update[i];
      }
      break;
    case UpdateType::rmsprop:
      for (std::size_t i = 0; i < n; ++i)
        update[i] = std::pow(diff[i], 2.0f);
      axpby(1.0f - u.rms_decay, update, u.rms_decay, h);
      for (std::size_t i = 0; i < n; ++i) {
        update[i] = std::pow(h[i], 0.5f) + u.delta;
        update[i] = diff[i] / update[i];
        diff[i] = u.lr * update[i];
      }
      break;
    case UpdateType::adadelta:
      for (std::size_t i = 0; i < n; ++i)
        update[i] = std::pow(diff[i], 2.0f);
      axpby(1.0f - u.momentum, update, u.momentum, h);
      for (std::size_t i = 0; i < n; ++i) {
        update[i] = u.delta + h2[i];
        temp[i] = u.delta + h[i];
        update[i] = std::pow(update[i] / temp[i], 0.5f);
        diff[i] = diff[i] * update[i];
        update[i] = std::pow(diff[i], 2.0f);
      }
      axpby(1.0f - u.momentum, update, u.momentum, h2);
      for (float& d : diff)
        d *= u.lr;
      break;
    case UpdateType::adam:  // m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; lr m / (sqrt v + eps)
      axpby(1.0f - u.momentum, diff, u.momentum, h);
      for (std::size_t i = 0; i < n; ++i)
        temp[i] = diff[i] * diff[i];
      axpby(1.0f - u.momentum2, temp, u.momentum2, h2);
      for (std::size_t i = 0; i < n; ++i) {
        temp[i] = std::pow(h2[i], 0.5f) + u.delta;
        temp[i] = h[i] / temp[i];
        diff[i] = u.lr * temp[i];
      }
      break;
  }
  for (std::size_t i = 0; i < n; ++i)
    s.param[i] += -1.0f * diff[i];  // Net::Update: caffe_axpy(-1, diff, data)
}

// Runs solver_update on `driver` with the state uploaded and downloaded around it.
void driver_step(hn::Driver& driver, const SolverUpdate& u, State& s,
                 const std::vector<float>& grad) {
  const index_t n = static_cast<index_t>(grad.size());
  DeviceArray param(driver, s.param), g(driver, grad), h(driver, s.history), h2(driver, s.history2);
  driver.solver_update(u, n, param.data(), g.data(), h.data(),
                       u.needs_history2() ? h2.data() : nullptr);
  s.param = param.host();
  s.history = h.host();
  s.history2 = h2.host();
}

std::unique_ptr<hn::Driver> make_reference() {
  return hn::make_driver(hn::Device{"reference", 0});
}

std::string label(const SolverUpdate& u) {
  return std::string(hn::update_type_name(u.type)) +
         (u.decay == 0.0f ? ""
          : u.l1          ? " L1"
                          : " L2") +
         " decay=" + std::to_string(u.decay) + " grad_scale=" + std::to_string(u.grad_scale);
}

// The regularisation and gradient-scale variants every rule runs with.
std::vector<SolverUpdate> variants(UpdateType type) {
  std::vector<SolverUpdate> out;
  for (const float decay : {0.0f, 5e-4f, 0.05f}) {
    for (const bool l1 : {false, true}) {
      if (decay == 0.0f && l1) continue;
      for (const float grad_scale : {1.0f, 0.37f}) {
        SolverUpdate u = settings_for(type);
        u.decay = decay;
        u.l1 = l1;
        u.grad_scale = grad_scale;
        out.push_back(u);
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("reference solver_update equals Caffe's solver code over three steps for every rule",
          "[solver_update]") {
  const auto ref = make_reference();
  const std::size_t n = 257;
  for (const UpdateType type : kTypes) {
    for (SolverUpdate u : variants(type)) {
      INFO(label(u));
      // Caffe's order: clip first (factor 0.8), then 1 / iter_size (2); one fused scale here.
      const float clip_scale = u.grad_scale == 1.0f ? 1.0f : 0.8f;
      const int iter_size = u.grad_scale == 1.0f ? 1 : 2;
      u.grad_scale = clip_scale * (1.0f / static_cast<float>(iter_size));
      State caffe = random_state(type, n, 40), driven = caffe;
      for (int step = 0; step < 3; ++step) {
        INFO("step " << step);
        const std::vector<float> grad = random_floats(n, 50 + step, -1.0f, 1.0f);
        caffe_step(u, clip_scale, iter_size, caffe, grad);
        driver_step(*ref, u, driven, grad);
        CHECK(max_rel_diff(driven.param, caffe.param) <= 1e-6);
        CHECK(max_rel_diff(driven.history, caffe.history) <= 1e-6);
        if (u.needs_history2()) CHECK(max_rel_diff(driven.history2, caffe.history2) <= 1e-6);
      }
    }
  }
}

TEST_CASE("reference solver_update gives the values worked out by hand", "[solver_update]") {
  const auto ref = make_reference();
  // One element: w = 0.5, grad = 0.2, h = 0.1, h2 = 0.04.
  const auto one = [&](const SolverUpdate& u) {
    State s{{0.5f}, {0.1f}, {0.04f}};
    driver_step(*ref, u, s, {0.2f});
    return s;
  };
  SolverUpdate u;
  SECTION("SGD, L2, grad_scale 0.5") {
    u.type = UpdateType::sgd;
    u.lr = 0.01f;
    u.momentum = 0.9f;
    u.decay = 5e-4f;
    u.grad_scale = 0.5f;
    // g = 0.2 * 0.5 + 5e-4 * 0.5 = 0.10025; h = 0.9 * 0.1 + 0.01 * 0.10025 = 0.0910025
    const State s = one(u);
    CHECK(s.history[0] == Approx(0.0910025).epsilon(1e-6));
    CHECK(s.param[0] == Approx(0.5 - 0.0910025).epsilon(1e-6));
  }
  SECTION("SGD, L1 on a negative weight") {
    u.type = UpdateType::sgd;
    u.lr = 0.1f;
    u.momentum = 0.0f;
    u.decay = 0.01f;
    u.l1 = true;
    State s{{-2.0f}, {0.0f}, {0.0f}};
    driver_step(*ref, u, s, {0.3f});
    // g = 0.3 + 0.01 * (-1) = 0.29; h = 0.029; w = -2.029
    CHECK(s.history[0] == Approx(0.029).epsilon(1e-6));
    CHECK(s.param[0] == Approx(-2.029).epsilon(1e-6));
  }
  SECTION("Nesterov") {
    u.type = UpdateType::nesterov;
    u.lr = 0.01f;
    u.momentum = 0.9f;
    // h' = 0.09 + 0.002 = 0.092; step = 1.9 * 0.092 - 0.9 * 0.1 = 0.0848
    const State s = one(u);
    CHECK(s.history[0] == Approx(0.092).epsilon(1e-6));
    CHECK(s.param[0] == Approx(0.5 - 0.0848).epsilon(1e-6));
  }
  SECTION("AdaGrad") {
    u.type = UpdateType::adagrad;
    u.lr = 0.01f;
    u.delta = 1e-8f;
    // h = 0.1 + 0.04 = 0.14; step = 0.01 * 0.2 / (sqrt(0.14) + 1e-8)
    const State s = one(u);
    CHECK(s.history[0] == Approx(0.14).epsilon(1e-6));
    CHECK(s.param[0] == Approx(0.5 - 0.01 * 0.2 / (std::sqrt(0.14) + 1e-8)).epsilon(1e-6));
  }
  SECTION("RMSProp") {
    u.type = UpdateType::rmsprop;
    u.lr = 0.01f;
    u.rms_decay = 0.9f;
    u.delta = 1e-8f;
    // h = 0.9 * 0.1 + 0.1 * 0.04 = 0.094
    const State s = one(u);
    CHECK(s.history[0] == Approx(0.094).epsilon(1e-6));
    CHECK(s.param[0] == Approx(0.5 - 0.01 * 0.2 / (std::sqrt(0.094) + 1e-8)).epsilon(1e-6));
  }
  SECTION("AdaDelta") {
    u.type = UpdateType::adadelta;
    u.lr = 1.0f;
    u.momentum = 0.95f;
    u.delta = 1e-6f;
    // h = 0.95 * 0.1 + 0.05 * 0.04 = 0.097; v = 0.2 * sqrt((0.04 + 1e-6) / (0.097 + 1e-6));
    // h2 = 0.95 * 0.04 + 0.05 * v^2; w = 0.5 - v
    const double v = 0.2 * std::sqrt((0.04 + 1e-6) / (0.097 + 1e-6));
    const State s = one(u);
    CHECK(s.history[0] == Approx(0.097).epsilon(1e-6));
    CHECK(s.history2[0] == Approx(0.95 * 0.04 + 0.05 * v * v).epsilon(1e-6));
    CHECK(s.param[0] == Approx(0.5 - v).epsilon(1e-6));
  }
  SECTION("Adam") {
    u.type = UpdateType::adam;
    u.lr = 0.001f;
    u.momentum = 0.9f;
    u.momentum2 = 0.999f;
    u.delta = 1e-8f;
    // m = 0.9 * 0.1 + 0.1 * 0.2 = 0.11; v = 0.999 * 0.04 + 0.001 * 0.04 = 0.04;
    // w = 0.5 - 0.001 * 0.11 / (0.2 + 1e-8)
    const State s = one(u);
    CHECK(s.history[0] == Approx(0.11).epsilon(1e-6));
    CHECK(s.history2[0] == Approx(0.04).epsilon(1e-6));
    CHECK(s.param[0] == Approx(0.5 - 0.001 * 0.11 / (0.2 + 1e-8)).epsilon(1e-6));
  }
}

TEST_CASE("solver_update matches the reference for every rule on every driver",
          "[solver_update][driver_ops]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto oracle = make_reference();
    const auto driver = hn::make_driver(config.device, config.options);
    // 100003 spans many blocks and goes parallel on a multi-threaded CPU driver (all rules
    // but SGD): the split over threads, which no variant changes, runs the variant with
    // every term only (all ten took 77 s of the suite under AddressSanitizer).
    for (const index_t n : {1, 3, 13, 97, 1031, 100003}) {
      INFO("n=" << n);
      const std::size_t count = static_cast<std::size_t>(n);
      for (const UpdateType type : kTypes) {
        std::vector<SolverUpdate> rules = variants(type);
        if (n > 10000) rules.erase(rules.begin(), rules.end() - 1);
        for (const SolverUpdate& u : rules) {
          INFO(label(u));
          State want = random_state(type, count, 70), got = want;
          for (int step = 0; step < 3; ++step) {
            INFO("step " << step);
            const std::vector<float> grad = random_floats(count, 80 + step, -1.0f, 1.0f);
            driver_step(*oracle, u, want, grad);
            driver_step(*driver, u, got, grad);
            CHECK(max_rel_diff(got.param, want.param) <= 1e-5);
            CHECK(max_rel_diff(got.history, want.history) <= 1e-5);
            CHECK(max_rel_diff(got.history2, want.history2) <= 1e-5);
          }
        }
      }
    }
  }
}

TEST_CASE("solver_update leaves history2 alone for the one-history rules on every driver",
          "[solver_update][driver_ops]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const index_t n = 31;
    for (const UpdateType type :
         {UpdateType::sgd, UpdateType::nesterov, UpdateType::adagrad, UpdateType::rmsprop}) {
      INFO(hn::update_type_name(type));
      const SolverUpdate u = settings_for(type);
      const std::vector<float> sentinel(31, 777.0f);
      DeviceArray param(*driver, random_floats(31, 1)), grad(*driver, random_floats(31, 2)),
          h(*driver, random_floats(31, 3, 0.0f, 1.0f)), h2(*driver, sentinel);
      driver->solver_update(u, n, param.data(), grad.data(), h.data(), h2.data());
      CHECK(h2.host() == sentinel);
      driver->solver_update(u, n, param.data(), grad.data(), h.data(), nullptr);
    }
  }
}

// A recorded update (Solver, SolverOptions::graphs) reads its rate and the loss it follows
// on the driver: the local rate is lr * *rate, bit for bit the update with that product as
// its lr, and a gate that is not finite updates nothing.
TEST_CASE("solver_update reads its rate and gate on the driver on every driver",
          "[solver_update][driver_ops]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const index_t n = 37;
    const std::size_t count = static_cast<std::size_t>(n);
    for (const UpdateType type : kTypes) {
      INFO(hn::update_type_name(type));
      SolverUpdate folded = settings_for(type);
      const float lr_mult = 2.0f, rate = 0.0123f;
      folded.lr = lr_mult * rate;
      SolverUpdate read = folded;
      read.lr = lr_mult;
      const State start = random_state(type, count, 90);
      const std::vector<float> grad = random_floats(count, 91, -1.0f, 1.0f);
      const auto step = [&](const SolverUpdate& u) {
        State s = start;
        driver_step(*driver, u, s, grad);
        return s;
      };
      const State folded_step = step(folded);
      for (const float gate :
           {1.5f, -3.0f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
        INFO("gate " << gate);
        DeviceArray scalars(*driver, std::vector<float>{rate, gate});
        read.rate = scalars.data();
        read.gate = scalars.data() + 1;
        const State got = step(read);
        const State& want = std::isfinite(gate) ? folded_step : start;
        CHECK(got.param == want.param);
        CHECK(got.history == want.history);
        CHECK(got.history2 == want.history2);
      }
      // A rate or gate outside the driver's memory is refused, naming it.
      if (!driver->capabilities().host_addressable) {
        const float host_rate = rate;
        read.rate = &host_rate;
        read.gate = nullptr;
        DeviceArray param(*driver, start.param), g(*driver, grad), h(*driver, start.history),
            h2(*driver, start.history2.empty() ? std::vector<float>(count) : start.history2);
        CHECK_THROWS_WITH(
            driver->solver_update(read, n, param.data(), g.data(), h.data(), h2.data()),
            Catch::Contains("solver_update") && Catch::Contains("rate"));
      }
    }
  }
}

TEST_CASE("solver_update with no elements touches nothing and accepts null arrays",
          "[solver_update][driver_ops]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto driver = hn::make_driver(config.device, config.options);
    const std::vector<float> sentinel(4, 777.0f);
    DeviceArray a(*driver, sentinel), b(*driver, sentinel), c(*driver, sentinel),
        d(*driver, sentinel);
    for (const UpdateType type : kTypes) {
      const SolverUpdate u = settings_for(type);
      driver->solver_update(u, 0, a.data(), b.data(), c.data(), d.data());
      driver->solver_update(u, 0, nullptr, nullptr, nullptr, nullptr);
    }
    CHECK(a.host() == sentinel);
    CHECK(c.host() == sentinel);
    CHECK(d.host() == sentinel);
  }
}

TEST_CASE("solver_update misuse errors name the call, the rule and the fault on every driver",
          "[solver_update][driver_ops][errors]") {
  const DriverConfig config = GENERATE(from_range(hn::test::driver_configs()));
  DYNAMIC_SECTION(config.label) {
    const auto owned = hn::make_driver(config.device, config.options);
    hn::Driver& d = *owned;
    const DeviceArray w(d, 16), g(d, 16), h(d, 16), h2(d, 16);
    SolverUpdate sgd = settings_for(UpdateType::sgd);
    SolverUpdate adam = settings_for(UpdateType::adam);

    CHECK_THAT(error_of([&] { d.solver_update(sgd, -1, w.data(), g.data(), h.data(), nullptr); }),
               Contains("solver_update (SGD)") && Contains("n must be >= 0, got -1"));
    CHECK_THAT(error_of([&] { d.solver_update(sgd, 16, nullptr, g.data(), h.data(), nullptr); }),
               Contains("solver_update (SGD)") && Contains("must not be null") && Contains("n=16"));
    CHECK_THAT(error_of([&] { d.solver_update(sgd, 16, w.data(), g.data(), nullptr, nullptr); }),
               Contains("solver_update (SGD)") && Contains("must not be null"));
    CHECK_THAT(error_of([&] { d.solver_update(adam, 16, w.data(), g.data(), h.data(), nullptr); }),
               Contains("solver_update (Adam)") && Contains("two histories") &&
                   Contains("history2 must not be null"));
    SolverUpdate adadelta = settings_for(UpdateType::adadelta);
    CHECK_THAT(
        error_of([&] { d.solver_update(adadelta, 16, w.data(), g.data(), h.data(), nullptr); }),
        Contains("solver_update (AdaDelta)") && Contains("history2 must not be null"));
    CHECK_THAT(error_of([&] { d.solver_update(sgd, 16, w.data(), g.data(), w.data(), nullptr); }),
               Contains("solver_update (SGD)") && Contains("distinct"));
    CHECK_THAT(error_of([&] { d.solver_update(adam, 16, w.data(), g.data(), h.data(), h.data()); }),
               Contains("solver_update (Adam)") && Contains("distinct"));

    SolverUpdate bad = sgd;
    bad.lr = std::numeric_limits<float>::quiet_NaN();
    CHECK_THAT(error_of([&] { d.solver_update(bad, 16, w.data(), g.data(), h.data(), nullptr); }),
               Contains("solver_update (SGD)") && Contains("lr must be finite"));
    bad = adam;
    bad.grad_scale = std::numeric_limits<float>::infinity();
    CHECK_THAT(error_of([&] { d.solver_update(bad, 16, w.data(), g.data(), h.data(), h2.data()); }),
               Contains("grad_scale must be finite, got inf"));
    bad = adam;
    bad.momentum2 = -std::numeric_limits<float>::infinity();
    CHECK_THAT(error_of([&] { d.solver_update(bad, 16, w.data(), g.data(), h.data(), h2.data()); }),
               Contains("momentum2 must be finite"));
    bad = sgd;
    bad.type = static_cast<UpdateType>(17);
    CHECK_THAT(error_of([&] { d.solver_update(bad, 16, w.data(), g.data(), h.data(), nullptr); }),
               Contains("solver_update") && Contains("unknown update type 17"));

    if (!d.can_address(hn::host_space())) {
      std::vector<float> host(16, 1.0f);
      CHECK_THAT(
          error_of([&] { d.solver_update(sgd, 16, w.data(), host.data(), h.data(), nullptr); }),
          Contains("solver_update") && Contains("grad") &&
              Contains("not memory of device " + d.name()));
    }
  }
}

TEST_CASE("a driver without solver_update runs the reference update on host copies",
          "[solver_update][generic]") {
  hn::test::register_core_driver();
  hn::DriverOptions separate;
  separate.set("separate_memory", true);
  const std::unique_ptr<hn::Driver> core = hn::make_driver(hn::Device{"core", 0}, separate);
  const std::unique_ptr<hn::Driver> reference = hn::make_driver(hn::Device{"reference", 0});
  const SolverUpdate adam = settings_for(UpdateType::adam);
  const std::vector<float> w = random_floats(8, 1), g = random_floats(8, 2);
  const std::vector<float> h = random_floats(8, 3), h2 = random_floats(8, 4, 0.0f, 1.0f);
  DeviceArray cw(*core, w), cg(*core, g), ch(*core, h), ch2(*core, h2);
  DeviceArray rw(*reference, w), rg(*reference, g), rh(*reference, h), rh2(*reference, h2);
  core->reset_transfer_stats();
  core->solver_update(adam, 8, cw.data(), cg.data(), ch.data(), ch2.data());
  reference->solver_update(adam, 8, rw.data(), rg.data(), rh.data(), rh2.data());
  CHECK(core->transfer_stats().to_host == 4);    // every operand
  CHECK(core->transfer_stats().to_device == 3);  // the three it writes
  CHECK(cw.host() == rw.host());
  CHECK(ch.host() == rh.host());
  CHECK(ch2.host() == rh2.host());
}
