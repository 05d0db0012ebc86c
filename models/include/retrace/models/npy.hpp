// NumPy's .npy files (format versions 1 to 3, little-endian, C order): how the demo takes
// starting latents from another implementation (--noise) and hands its final latents back
// (--save-latents), e.g. numpy.save("noise.npy", torch.randn(1, 4, 32, 32).numpy()).
//
//   retrace::Tensor noise = retrace::models::read_npy("noise.npy");   // host float32 tensor
//   retrace::models::write_npy("latents.npy", latents);                // any device, as float32
#pragma once

#include <retrace/tensor.hpp>

#include <string>

namespace retrace::models {

// The array as a host float32 tensor of its shape. float32, float64 (rounded to nearest) and
// float16 arrays are read; anything else (another dtype, big-endian data, Fortran order, a
// malformed header, a size that overflows, a file shorter or longer than its header says) is
// an invalid_argument naming the path and what is wrong.
[[nodiscard]] Tensor read_npy(const std::string& path);

// The tensor's values as a float32 array of its shape (format version 1.0). A file that cannot
// be written is an invalid_argument naming the path.
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace retrace::models
