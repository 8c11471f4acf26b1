// at::PrivateUse1HooksInterface for sim.
//
// In torch 2.11 the base class (ATen/detail/PrivateUse1HooksInterface.h)
// *throws* "You should register PrivateUse1HooksInterface ... and implement
// X" for: isBuilt, isAvailable, getDefaultGenerator, getNewGenerator,
// getDeviceFromPtr, getPinnedMemoryAllocator, hasPrimaryContext (pure in
// AcceleratorHooksInterface, throwing in PU1's), resizePrivateUse1Bytes.
// deviceCount/setCurrentDevice/getCurrentDevice/exchangeDevice/
// maybeExchangeDevice fall to AcceleratorHooksInterface, which throws or
// returns 0. isPinnedPtr defaults to false; init() marks the allocator initialised.
//
// Who calls what (2.11):
//   hasPrimaryContext  autograd engine (GraphTask::stash_current_streams,
//                      for the accelerator = PrivateUse1 whenever a PU1
//                      backend is registered, even in a CUDA process!)
//   getDefaultGenerator at::globalContext().defaultGenerator(sim:i),
//                      at::manual_seed() (seeds all accelerator devices)
//   getPinnedMemoryAllocator / isPinnedPtr  pin_memory / is_pinned
//   getDeviceFromPtr   at::from_blob(ptr, ..., device unspecified index)
//   deviceCount/...Device  at::accelerator::* (device-generic C++ API)
//   resizePrivateUse1Bytes  Python's UntypedStorage.resize_ on sim
#include "fsdpx/sim/sim.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/util/Exception.h>


namespace fsdpx::sim {

namespace {

struct SimHooks final : public at::PrivateUse1HooksInterface {
  void init() const override { note_initialised(); }  // the allocator's statistics exist from now on
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  // No lazily created per-device context: every device is always "active".
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    
    return true;
  }

  c10::DeviceIndex deviceCount() const override {
    
    return device_count();
  }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    
    set_device(d);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    
    const auto old = current_device();
    if (d >= 0) set_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    
    return exchangeDevice(d);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex i) const override {
    
    return default_generator(i);
  }
  at::Generator getNewGenerator(c10::DeviceIndex i) const override {
    
    return new_generator(i);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    
    c10::DeviceIndex idx = -1;
    TORCH_CHECK(is_device_ptr(data, &idx), "sim: ", data,
                " is not a pointer into sim device memory");
    return device(idx);
  }

  bool isPinnedPtr(const void* data) const override {
    
    return is_pinned_ptr(data);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    
    return pinned_allocator();
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    
    resize_bytes_sim(storage.unsafeGetStorageImpl(), newsize);
  }
};

const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new SimHooks());  // leaked on purpose
  return true;
}();

}  // namespace

}  // namespace fsdpx::sim
