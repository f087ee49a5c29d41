// Owning wrappers for cuDNN's legacy descriptors (host-side objects: creating
// and destroying them never touches the GPU or a stream).
#pragma once

#include <cudnn.h>

#include <utility>

#include "gpu_internal.h"
#include "weft/checked_call.h"
#include "weft/dtype.h"

namespace weft::kernels::gpu::detail {

// cuDNN's blending factors (y = one * result + zero * y), passed by address.
inline constexpr float kOne = 1.0f;
inline constexpr float kZero = 0.0f;

template <class T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class CudnnDescriptor {
 public:
  CudnnDescriptor() { WEFT_CUDNN_CHECK(Create(&d_)); }
  ~CudnnDescriptor() {
    // A destructor must not throw, and a failed destroy only leaks host memory.
    if (d_ != nullptr) (void)Destroy(d_);
  }
  CudnnDescriptor(CudnnDescriptor&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  CudnnDescriptor& operator=(CudnnDescriptor&& other) noexcept {
    std::swap(d_, other.d_);
    return *this;
  }
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;

  T get() const noexcept { return d_; }
  operator T() const noexcept { return d_; }  // NOLINT: pass straight to cuDNN calls

 private:
  T d_ = nullptr;
};

using TensorDescriptor =
    CudnnDescriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor =
    CudnnDescriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor = CudnnDescriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor,
                                              cudnnDestroyConvolutionDescriptor>;

// A dense NCHW tensor (float32 unless `type` says otherwise).
inline TensorDescriptor nchw_tensor(int n, int c, int h, int w, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
  TensorDescriptor d;
  WEFT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, type, n, c, h, w));
  return d;
}

// A dense 4-D tensor of sizes [n, c, h, w] stored NCHW, or NHWC with `nhwc`
// (CUDNN_TENSOR_NHWC: channels last, what the tensor-core kernels want).
inline TensorDescriptor tensor_4d(bool nhwc, int n, int c, int h, int w, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
  TensorDescriptor d;
  WEFT_CUDNN_CHECK(
      cudnnSetTensor4dDescriptor(d, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, type, n, c, h, w));
  return d;
}

// cuDNN's data type for a tensor of dtype t; dtypes without GPU kernels throw
// weft::Error naming `op` and the dtype.
inline cudnnDataType_t cudnn_type(DType t, const char* op) {
  switch (t) {
    case DType::float32: return CUDNN_DATA_FLOAT;
    case DType::bfloat16: return CUDNN_DATA_BFLOAT16;
    case DType::float16: return CUDNN_DATA_HALF;
    default: unsupported_dtype(op, t);
  }
}

}  // namespace weft::kernels::gpu::detail
