#include "model/engine/device_context.h"

#include <ATen/ATen.h>

#ifdef KRAUSE_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace krause {

DeviceContext::DeviceContext(const at::Device& device) : device_(device) {
#ifdef KRAUSE_WITH_CUDA
  if (device_.is_cuda()) {
    stream_ = std::make_shared<c10::cuda::CUDAStream>(
        c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index()));
  }
#endif
}

std::shared_ptr<void> DeviceContext::Enter() const {
#ifdef KRAUSE_WITH_CUDA
  if (stream_ != nullptr) {
    return std::make_shared<c10::cuda::CUDAStreamGuard>(
        *static_cast<const c10::cuda::CUDAStream*>(stream_.get()));
  }
#endif
  return nullptr;
}

void DeviceContext::WaitForDefaultStream() const {
#ifdef KRAUSE_WITH_CUDA
  if (stream_ != nullptr) c10::cuda::getDefaultCUDAStream(device_.index()).synchronize();
#endif
}

at::Tensor DeviceContext::HostBuffer(at::IntArrayRef shape, at::ScalarType type) const {
  return at::empty(shape, at::TensorOptions().dtype(type).pinned_memory(device_.is_cuda()));
}

}  // namespace krause
