#include "retrace/models/safetensors.hpp"

#include <nlohmann/json.hpp>
#include <retrace/error.hpp>

#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

namespace retrace::models {

namespace {

struct FileType {
  const char* name;
  DType dtype;
  std::size_t size;
};
constexpr FileType kTypes[] = {{"F32", DType::float32, 4}, {"BF16", DType::bfloat16, 2},
                               {"I32", DType::int32, 4},   {"U32", DType::uint32, 4},
                               {"U8", DType::uint8, 1},    {"F16", DType::float32, 2}};

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    while ((mantissa & 0x400u) == 0) {  // normalise a subnormal
      mantissa <<= 1;
      --exponent;
    }
    ++exponent;
    mantissa &= 0x3ffu;
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RETRACE_CHECK(in.good(), invalid_argument, "safetensors: cannot open {}", path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Tensor read_entry(const std::string& path, const std::string& name, const nlohmann::json& entry,
                  const char* data, std::size_t data_size) {
  RETRACE_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                    entry.contains("data_offsets"),
                invalid_argument, "safetensors: {}: entry \"{}\" needs dtype, shape and data_offsets",
                path, name);
  const std::string dtype = entry["dtype"].get<std::string>();
  const FileType* type = nullptr;
  for (const FileType& t : kTypes) {
    if (dtype == t.name) type = &t;
  }
  RETRACE_CHECK(type != nullptr, invalid_argument,
                "safetensors: {}: tensor \"{}\" has dtype {}; supported: F32, BF16, F16, I32, U32, U8",
                path, name, dtype);
  std::vector<std::int64_t> dims = entry["shape"].get<std::vector<std::int64_t>>();
  const Shape shape{std::span<const std::int64_t>(dims)};
  const auto offsets = entry["data_offsets"].get<std::vector<std::uint64_t>>();
  RETRACE_CHECK(offsets.size() == 2 && offsets[0] <= offsets[1] && offsets[1] <= data_size,
                invalid_argument,
                "safetensors: {}: tensor \"{}\" has data_offsets outside the {} bytes of data",
                path, name, data_size);
  const std::size_t bytes = offsets[1] - offsets[0];
  RETRACE_CHECK(bytes == static_cast<std::size_t>(shape.numel()) * type->size, invalid_argument,
                "safetensors: {}: tensor \"{}\" has {} bytes of data but shape {} of {} needs {}",
                path, name, bytes, shape, dtype, static_cast<std::size_t>(shape.numel()) * type->size);
  const char* src = data + offsets[0];
  if (std::strcmp(type->name, "F16") == 0) {
    std::vector<float> values(static_cast<std::size_t>(shape.numel()));
    for (std::size_t i = 0; i < values.size(); ++i) {
      std::uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      values[i] = half_to_float(h);
    }
    return Tensor::from_vector<float>(values, shape, DType::float32);
  }
  Tensor tensor = Tensor::empty_host(shape, type->dtype);
  std::memcpy(tensor.host_bytes_mutable().data(), src, bytes);
  return tensor;
}

}  // namespace

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  const std::vector<char> file = read_file(path);
  RETRACE_CHECK(file.size() >= 8, invalid_argument,
                "safetensors: {} is truncated: {} bytes, not even the 8-byte header length", path,
                file.size());
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, file.data(), 8);
  RETRACE_CHECK(header_size <= file.size() - 8, invalid_argument,
                "safetensors: {} is truncated: the header claims {} bytes, the file has {} after "
                "the length",
                path, header_size, file.size() - 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(header_size));
  } catch (const nlohmann::json::exception& e) {
    RETRACE_FAIL(invalid_argument, "safetensors: {}: the header is not valid JSON: {}", path, e.what());
  }
  RETRACE_CHECK(header.is_object(), invalid_argument,
                "safetensors: {}: the header is not a JSON object", path);
  const char* data = file.data() + 8 + header_size;
  const std::size_t data_size = file.size() - 8 - header_size;
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      tensors.emplace(name, read_entry(path, name, entry, data, data_size));
    } catch (const nlohmann::json::exception& e) {
      RETRACE_FAIL(invalid_argument, "safetensors: {}: entry \"{}\" is malformed: {}", path, name,
                   e.what());
    }
  }
  return tensors;
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::vector<char> data;
  for (const auto& [name, tensor] : tensors) {
    tensor.check_not_null("write_safetensors", name);
    const Tensor host = tensor.layout() == Layout::row_major ? tensor.to_host() : Tensor();
    RETRACE_CHECK(!host.is_null(), invalid_argument,
                  "write_safetensors: tensor \"{}\" is in tile layout; convert it to row_major", name);
    const char* type = nullptr;
    for (const FileType& t : kTypes) {
      if (t.dtype == host.dtype() && t.size == dtype_size(host.dtype())) {
        type = t.name;
        break;
      }
    }
    const auto bytes = host.host_bytes();
    header[name] = {{"dtype", type},
                    {"shape", std::vector<std::int64_t>(host.shape().dims().begin(), host.shape().dims().end())},
                    {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    const auto* raw = reinterpret_cast<const char*>(bytes.data());
    data.insert(data.end(), raw, raw + bytes.size());
  }
  const std::string text = header.dump();
  const std::uint64_t size = text.size();
  std::ofstream out(path, std::ios::binary);
  RETRACE_CHECK(out.good(), invalid_argument, "write_safetensors: cannot create {}", path);
  out.write(reinterpret_cast<const char*>(&size), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  RETRACE_CHECK(out.good(), invalid_argument, "write_safetensors: writing {} failed", path);
}

}  // namespace retrace::models
