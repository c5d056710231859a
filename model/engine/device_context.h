// Where a worker thread (a generator's decode engine, a classifier's batcher) runs its model.
//
// On the CPU it is a no-op. On a GPU (CUDA builds) each context owns a CUDA stream from
// LibTorch's pool, so that the workers of different models queue their kernels independently
// instead of serialising on the default stream, and hands out pinned host buffers, from which
// uploads are asynchronous DMA copies.
// Thread-safety: one worker thread uses a context; Enter() applies to the calling thread only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

namespace krause {

class DeviceContext {
 public:
  explicit DeviceContext(const at::Device& device);

  const at::Device& device() const { return device_; }
  bool cuda() const { return device_.is_cuda(); }

  // While the returned scope lives, the calling thread's current stream on this device is the
  // context's own (CUDA); nothing on the CPU.
  std::shared_ptr<void> Enter() const;

  // Waits (blocking the caller) until the work queued so far on the device's default stream is
  // done: loading, allocating and filling tensors outside Enter() runs there, and the context's
  // own stream is not ordered after it. Call once after setting up, before the first Enter()
  // work. Nothing on the CPU.
  void WaitForDefaultStream() const;

  // A host tensor to stage uploads and downloads in: pinned memory for a CUDA context, ordinary
  // memory otherwise.
  at::Tensor HostBuffer(at::IntArrayRef shape, at::ScalarType type) const;

 private:
  at::Device device_;
  std::shared_ptr<void> stream_;  // c10::cuda::CUDAStream in CUDA builds; null on the CPU
};

}  // namespace krause
