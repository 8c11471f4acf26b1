// Random number generators of the sim devices.
//
// Problem: random ops on sim run through the boxed CPU fallback, i.e. as CPU
// kernels on CPU copies. A CPU kernel (normal_, bernoulli_, ...) only takes a
// generator whose device type is CPU (at::check_generator), and with no
// generator it draws from the *CPU* default generator. So neither "use the
// sim device's generator" nor "explicit sim generator" works out of the box.
//
// Solution: a sim generator is a thin GeneratorImpl (device sim:i) that
// forwards seed/state calls to a private CPUGeneratorImpl (its "CPU twin").
// The fallback (sim_fallback.cpp) replaces, in the op's arguments, a sim
// generator by its twin and an absent generator by the twin of the device's
// default generator. Consequences:
//   * sim RNG is a stream separate from the CPU RNG, as with CUDA;
//   * same seed on sim and CPU -> bit-identical random tensors, so sim runs
//     can be compared with CPU reference runs even with dropout;
//   * get_state()/set_state() (activation checkpointing's RNG save/restore)
//     and at::manual_seed() (seeds the accelerator's default generators via
//     the hooks) work as for CUDA. The state format is the CPU one (a
//     5056-byte mt19937 state), not CUDA's (seed, offset) Philox pair;
//     set_offset/get_offset are forwarded and, like on CPU, throw
//     "CPU Generator does not use offset". Code that manipulates Philox
//     offsets directly (CUDA-graph-safe RNG) cannot be tested on sim.
#include "fsdpx/sim/sim.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/core/TensorImpl.h>

#include <mutex>
#include <vector>

namespace fsdpx::sim {

namespace {

class SimGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit SimGeneratorImpl(c10::DeviceIndex index)
      : c10::GeneratorImpl(fsdpx::sim::device(index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val)) {}

  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // Every call is forwarded under the twin's mutex: CPU kernels lock that
  // mutex (not ours) while they draw numbers.
  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> g(cpu_.mutex());
    cpu_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> g(cpu_.mutex());
    cpu_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    std::lock_guard<std::mutex> g(cpu_.mutex());
    return cpu_.get_offset();
  }
  uint64_t current_seed() const override {
    std::lock_guard<std::mutex> g(cpu_.mutex());
    return cpu_.current_seed();
  }
  uint64_t seed() override {
    std::lock_guard<std::mutex> g(cpu_.mutex());
    return cpu_.seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    std::lock_guard<std::mutex> g(cpu_.mutex());
    cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> g(cpu_.mutex());
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }

  const at::Generator& twin() const { return cpu_; }

 private:
  SimGeneratorImpl* clone_impl() const override {
    auto* copy = new SimGeneratorImpl(device_.index());
    std::lock_guard<std::mutex> g(cpu_.mutex());
    copy->cpu_ = cpu_.clone();
    return copy;
  }

  // mutable: mutex() is non-const on at::Generator
  mutable at::Generator cpu_;
};

std::vector<at::Generator>& defaults() {
  static auto* gens = [] {
    auto* v = new std::vector<at::Generator>();  // leaked: used at exit
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      v->push_back(at::make_generator<SimGeneratorImpl>(i));
      // Like CUDA: default generators start from the default seed (67280421310721)
      // so that runs are reproducible without manual_seed.
    }
    return v;
  }();
  return *gens;
}

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  if (index < 0) index = current_device();
  TORCH_CHECK(index < device_count(), "sim: no device ", int(index));
  return defaults()[index];
}

at::Generator new_generator(c10::DeviceIndex index) {
  if (index < 0) index = current_device();
  return at::make_generator<SimGeneratorImpl>(index);
}

at::Generator cpu_twin(const at::Generator& g) {
  TORCH_CHECK(g.defined() && g.device().type() == c10::DeviceType::PrivateUse1,
              "sim: cpu_twin wants a sim generator");
  return static_cast<SimGeneratorImpl*>(g.unsafeGetGeneratorImpl())->twin();
}

}  // namespace fsdpx::sim
