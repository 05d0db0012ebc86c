// A reader and writer for the .safetensors format (an 8-byte little-endian header length, a JSON
// header mapping names to {dtype, shape, data_offsets}, then the raw little-endian data), so
// real checkpoints can be loaded. Reading checks everything and names what is wrong: a
// truncated file, a header that is not valid JSON or lacks fields, an unsupported dtype,
// offsets outside the data or not matching the shape.
//
//   auto weights = retrace::models::read_safetensors("dit.safetensors");   // host tensors
//   retrace::models::write_safetensors("out.safetensors", weights);
#pragma once

#include <retrace/tensor.hpp>

#include <map>
#include <string>

namespace retrace::models {

// Host tensors by name. F32, BF16, I32, U32 and U8 keep their dtype; F16 becomes float32.
[[nodiscard]] std::map<std::string, Tensor> read_safetensors(const std::string& path);
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors);

}  // namespace retrace::models
