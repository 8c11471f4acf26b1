#include "fsdpx/framework/runtime/device.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <vector>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "fsdpx/error.h"
#include "device_libraries.h"

namespace fsdpx {

const char* stream_role_name(StreamRole role) {
  switch (role) {
    case StreamRole::Compute: return "compute";
    case StreamRole::AllGatherCopyIn: return "all-gather copy-in";
    case StreamRole::AllGather: return "all-gather";
    case StreamRole::ReduceScatter: return "reduce-scatter";
    case StreamRole::AllReduce: return "all-reduce";
    case StreamRole::Offload: return "offload";
  }
  return "stream";
}

DeviceRuntime::~DeviceRuntime() = default;

void DeviceRuntime::join_streams() const {
  for (int r = 1; r < kStreamRoles; ++r) wait_stream(StreamRole::Compute, static_cast<StreamRole>(r));
  for (int r = 1; r < kStreamRoles; ++r) wait_stream(static_cast<StreamRole>(r), StreamRole::Compute);
}

OnStream::OnStream(const DeviceRuntime& device, StreamRole role) {
  if (!device.is_cpu()) guard_.reset_stream(device.stream(role));
}

namespace {

// A generator's state, and its restoration, under its lock (kernels draw under it).
at::Tensor state_of(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}
void restore(at::Generator g, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

class CpuRuntime final : public DeviceRuntime {
 public:
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  c10::Stream stream(StreamRole) const override { return c10::Stream(c10::Stream::DEFAULT, device()); }
  void wait_stream(StreamRole, StreamRole) const override {}
  MemoryStats memory_stats() const override { return cpu_memory_stats(); }
  void reset_peak_memory() const override { reset_cpu_peak_memory(); }
  int64_t free_memory() const override {
    return static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  }
  void resize_storage(const c10::Storage& storage, size_t bytes) const override {
    resize_storage_bytes(storage, bytes);
  }
  at::TensorOptions host_options() const override { return at::TensorOptions(); }
  at::Tensor rng_state() const override { return state_of(at::detail::getDefaultCPUGenerator()); }
  void set_rng_state(const at::Tensor& state) const override { restore(at::detail::getDefaultCPUGenerator(), state); }
  void synchronize() const override {}
};

constexpr size_t kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

// A device with LibTorch's device-generic interfaces: a DeviceGuardImplInterface (streams,
// events), a DeviceAllocator (statistics) and a default generator. CUDA and PrivateUse1 (sim)
// alike; what is proven on sim is what runs on CUDA.
class AcceleratorRuntime final : public DeviceRuntime {
 public:
  explicit AcceleratorRuntime(c10::Device device) : device_(device), guard_(device.type()) {
    // CUDA's caching allocator exists only once the device type is initialised (the first tensor
    // does it); its statistics before then fail ("Invalid device argument"), and the memory check
    // reads them before the run allocates anything.
    at::globalContext().lazyInitDevice(device_.type());
    guard_.setDevice(device_);
    streams_.push_back(guard_.getStream(device_));  // StreamRole::Compute
    for (int r = 1; r < kStreamRoles; ++r)
      streams_.push_back(guard_.getStreamFromGlobalPool(device_, /*isHighPriority=*/false));
  }
  c10::Device device() const override { return device_; }
  c10::Stream stream(StreamRole role) const override { return streams_[static_cast<size_t>(role)]; }
  void wait_stream(StreamRole waiter, StreamRole done) const override {
    const c10::Stream w = stream(waiter), d = stream(done);
    if (w == d) return;
    c10::Event ended(device_.type());
    ended.record(d);
    ended.block(w);
  }

  MemoryStats memory_stats() const override {
    const auto s = c10::getDeviceAllocator(device_.type())->getDeviceStats(device_.index());
    MemoryStats m;
    m.allocated = s.allocated_bytes[kAggregate].current;
    m.peak_allocated = s.allocated_bytes[kAggregate].peak;
    m.reserved = s.reserved_bytes[kAggregate].current;
    m.peak_reserved = s.reserved_bytes[kAggregate].peak;
    return m;
  }
  void reset_peak_memory() const override { c10::getDeviceAllocator(device_.type())->resetPeakStats(device_.index()); }
  int64_t free_memory() const override {
    // The driver's free bytes, and the allocator's cached blocks that no tensor holds.
    const MemoryStats m = memory_stats();
    const auto info = c10::getDeviceAllocator(device_.type())->getMemoryInfo(device_.index());
    return static_cast<int64_t>(info.first) + std::max<int64_t>(0, m.reserved - m.allocated);
  }

  void resize_storage(const c10::Storage& storage, size_t bytes) const override {
    resize_storage_bytes(storage, bytes);
  }

  at::TensorOptions host_options() const override { return at::TensorOptions().pinned_memory(true); }
  at::Tensor rng_state() const override { return state_of(generator()); }
  void set_rng_state(const at::Tensor& state) const override { restore(generator(), state); }
  void synchronize() const override { guard_.synchronizeDevice(device_.index()); }

 private:
  at::Generator generator() const { return at::globalContext().defaultGenerator(device_); }

  c10::Device device_;
  c10::impl::VirtualGuardImpl guard_;
  std::vector<c10::Stream> streams_;  // by StreamRole
};

// A device library (see device_libraries.h): loaded once, from `env` when set, else from beside
// libfsdpx.
class DeviceLibrary {
 public:
  DeviceLibrary(const char* file, const char* env, const char* needed_by)
      : file_(file), env_(env), needed_by_(needed_by) {}

  void* load() {
    std::call_once(once_, [this] {
      std::string path;
      if (const char* env = std::getenv(env_); env && *env) {
        path = env;
      } else {
        Dl_info info{};
        if (dladdr(reinterpret_cast<void*>(&load_sim), &info) && info.dli_fname)
          path = (std::filesystem::path(info.dli_fname).parent_path() / file_).string();
      }
      // RTLD_GLOBAL: its registrations with LibTorch hold pointers into it for the life of the process.
      if (!path.empty()) handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
      if (!handle_) {
        const char* why = path.empty() ? nullptr : ::dlerror();
        failure_ = std::string(needed_by_) + ", " + file_ + ", which did not load from " +
                   (path.empty() ? std::string("beside libfsdpx") : path) + (why ? std::string(": ") + why : "") +
                   "; build it (make build) or point " + env_ + " at it";
      }
    });
    if (!handle_) throw Error(failure_);
    return handle_;
  }

  void* function(const char* name) {
    void* f = ::dlsym(load(), name);
    if (!f)
      throw Error(std::string(file_) + " has no " + name +
                  ": it is older than this libfsdpx; rebuild both (make build)");
    return f;
  }

 private:
  const char* file_;
  const char* env_;
  const char* needed_by_;
  std::once_flag once_;
  void* handle_ = nullptr;
  std::string failure_;
};

DeviceLibrary& sim_library() {
  static DeviceLibrary lib("libfsdpx_sim.so", "FSDPX_SIM_LIBRARY", "--device sim needs the simulated device's library");
  return lib;
}

DeviceLibrary& cuda_library() {
  static DeviceLibrary lib("libfsdpx_cuda.so", "FSDPX_CUDA_LIBRARY",
                           "CUDA needs fsdpx's CUDA library (it loads LibTorch's CUDA libraries)");
  return lib;
}

}  // namespace

void load_sim() { sim_library().load(); }

void load_cuda() {
#ifdef FSDPX_WITH_CUDA
  cuda_library().load();
#else
  throw Error("this fsdpx was built without CUDA (its LibTorch has none); train with --device cpu or --device sim");
#endif
}

void* cuda_function(const char* name) {
  load_cuda();
  return cuda_library().function(name);
}

namespace {

// How many devices of `type` this process sees (0 when the type has no runtime here).
int visible_devices(c10::DeviceType type) {
#ifndef FSDPX_WITH_CUDA
  if (type == c10::kCUDA) return 0;  // a LibTorch without CUDA: "no GPU visible", as on a machine without one
#endif
  if (type == c10::kCUDA) {
    // LibTorch decides once, the first time anything asks, whether CUDA is there: asked before
    // libtorch_cuda loaded, it has said no for the life of the process.
    if (!at::detail::getCUDAHooks().hasCUDART())
      throw Error("--device cuda: LibTorch was asked about CUDA before libfsdpx_cuda.so (and with it "
                  "libtorch_cuda) loaded, and has no CUDA in this process; link this program with LibTorch's "
                  "CUDA libraries (CMake target fsdpx_torch, or torch), or open the device before any other "
                  "use of CUDA");
    if (!at::hasCUDA()) return 0;
  }
  return c10::impl::VirtualGuardImpl(type).deviceCount();
}

c10::DeviceType device_type_of(const std::string& spec) {
  if (spec == "cpu") return c10::kCPU;
  if (spec == "cuda") {
#ifdef FSDPX_WITH_CUDA
    load_cuda();  // before anything asks LibTorch about CUDA
#endif
    return c10::kCUDA;
  }
  if (spec == "sim") {
    load_sim();
    return c10::kPrivateUse1;
  }
  throw Error("--device must be cpu, cuda or sim, got '" + spec + "'");
}

}  // namespace

void check_device(const std::string& spec, int local_ranks, bool one_device_per_rank) {
  const c10::DeviceType type = device_type_of(spec);
  if (type == c10::kCPU) return;
  const int count = visible_devices(type);
  if (count == 0) {
    std::string found = "no GPU visible";
    if (type == c10::kCUDA) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      found += visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : std::string(" to this process");
      found += at::hasCUDA() ? "" : ": LibTorch found no CUDA device or driver";
    }
    throw Error("--device " + spec + ": " + found +
                "; train with --device cpu (or --device sim, the simulated accelerator)");
  }
  if (one_device_per_rank && local_ranks > count)
    throw Error("--device " + spec + ": " + std::to_string(local_ranks) + " ranks on this node but " +
                std::to_string(count) + " device(s) visible, and NCCL takes one rank per device; run at most " +
                std::to_string(count) + " rank(s) here, or let ranks share devices: --share-gpus (NCCL, each rank "
                "a node of its own over loopback sockets: for tests and for checking a run) or --backend gloo "
                "(collectives staged through host memory)");
}

int visible_device_count(const std::string& spec) {
  const c10::DeviceType type = device_type_of(spec);
  return type == c10::kCPU ? 1 : visible_devices(type);
}

c10::Device device_for_rank(const std::string& spec, int local_rank) {
  const c10::DeviceType type = device_type_of(spec);
  if (type == c10::kCPU) return c10::Device(c10::kCPU);
  const int count = visible_devices(type);
  check_device(spec, 1, true);
  // Device local_rank; ranks share devices round-robin when there are more (check_device decides
  // whether they may); a rank that sees one device (srun --gpus-per-task=1) uses it.
  return c10::Device(type, static_cast<c10::DeviceIndex>(local_rank % count));
}

std::shared_ptr<DeviceRuntime> open_device(const std::string& spec, int local_rank) {
  const c10::Device device = device_for_rank(spec, local_rank);
  if (device.is_cpu()) return std::make_shared<CpuRuntime>();
  return std::make_shared<AcceleratorRuntime>(device);
}

}  // namespace fsdpx
