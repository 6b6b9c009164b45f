// CUDA back end of the models: lr, wdl, deepfm and dlrm computed on a GPU,
// with exactly the math (docs/models.md), parameters and buffers of the CPU
// models that Model::Create returns.
//
// The interface stays the host one of Model: ForwardBackward takes the batch
// and parameters in host vectors, copies them to the GPU, computes there
// (cuBLAS for the Linear layers, kernels of our own for the rest) and copies
// predictions and gradients back before it returns. Device memory is kept
// and reused across calls, growing to the largest batch seen.
//
// Host code includes only this header; the CUDA code lives in the
// models/cuda_*.cu files (models/cuda/cuda_model_none.cc when CUDA is off).
//
// Thread-safety: as Model: const methods are safe for concurrent use;
// ForwardBackward, one thread at a time per model (any thread: the model
// selects its GPU on every call).

#ifndef EPS_MODELS_CUDA_CUDA_MODEL_H_
#define EPS_MODELS_CUDA_CUDA_MODEL_H_

#include <memory>

#include "core/status.h"
#include "models/model.h"

namespace eps {

// Creates the CUDA model of `options` on the calling thread's current GPU
// (device 0 unless the caller selected another). The model owns its CUDA
// stream, cuBLAS handle and device memory.
//
// Returns kInvalidArgument for options Model::Create rejects;
// kFailedPrecondition when this build has no CUDA back end or no GPU is
// usable (the message says why: no driver, an old driver, no device), or
// when the GPU refuses a stream or cuBLAS handle.
//
// A CUDA or cuBLAS failure inside ForwardBackward is not recoverable (the
// device state is unknown): it CHECK-fails with the error string.
StatusOr<std::unique_ptr<Model>> CreateCudaModel(const ModelOptions& options);

// Opens the libraries the CUDA models load at run time rather than link
// (cuBLAS), as CreateCudaModel does first; needs no GPU. Later calls return
// the first result. kFailedPrecondition naming the library when it cannot
// be opened or lacks a function, or when this build has no CUDA back end.
Status LoadCudaLibraries();

}  // namespace eps

#endif  // EPS_MODELS_CUDA_CUDA_MODEL_H_
