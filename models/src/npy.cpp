#include "retrace/models/npy.hpp"

#include <retrace/error.hpp>
#include <retrace/float16.hpp>

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string_view>
#include <vector>

namespace retrace::models {

namespace {

constexpr std::string_view kMagic{"\x93NUMPY", 6};

// The value of `key` in the header's dict literal ({'descr': '<f4', 'fortran_order': False,
// 'shape': (1, 4), }), as the text up to the next top-level comma or closing brace.
std::string_view header_value(std::string_view header, std::string_view key,
                              const std::string& path) {
  const std::string quoted = fmt::format("'{}'", key);
  const std::size_t at = header.find(quoted);
  RETRACE_CHECK(at != std::string_view::npos, invalid_argument,
                "npy: {}: the header has no {} ({})", path, quoted, header);
  std::size_t begin = header.find(':', at + quoted.size());
  RETRACE_CHECK(begin != std::string_view::npos, invalid_argument,
                "npy: {}: the header's {} has no value", path, quoted);
  ++begin;
  while (begin < header.size() && header[begin] == ' ') ++begin;
  std::size_t end = begin;
  int depth = 0;
  for (; end < header.size(); ++end) {
    const char ch = header[end];
    if (ch == '(') ++depth;
    if (ch == ')') --depth;
    if (depth == 0 && (ch == ',' || ch == '}')) break;
  }
  std::string_view value = header.substr(begin, end - begin);
  while (!value.empty() && value.back() == ' ') value.remove_suffix(1);
  return value;
}

Shape parse_shape(std::string_view text, const std::string& path) {
  RETRACE_CHECK(text.size() >= 2 && text.front() == '(' && text.back() == ')', invalid_argument,
                "npy: {}: the shape {} is not a tuple", path, text);
  std::vector<std::int64_t> dims;
  std::int64_t elements = 1;
  std::string_view rest = text.substr(1, text.size() - 2);
  while (true) {
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == ',')) rest.remove_prefix(1);
    if (rest.empty()) break;
    std::int64_t dim = 0;
    std::size_t digits = 0;
    while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') {
      RETRACE_CHECK(dim <= (std::numeric_limits<std::int64_t>::max() - 9) / 10, invalid_argument,
                    "npy: {}: the shape {} has a size too large", path, text);
      dim = dim * 10 + (rest[digits] - '0');
      ++digits;
    }
    if (digits < rest.size() && rest[digits] == 'L') ++digits;  // Python 2's long literals
    RETRACE_CHECK(digits > 0 && (digits == rest.size() || rest[digits] == ',' || rest[digits] == ' '),
                  invalid_argument, "npy: {}: the shape {} is not a tuple of whole numbers", path,
                  text);
    dims.push_back(dim);
    RETRACE_CHECK(dims.size() <= Shape::kMaxRank, invalid_argument,
                  "npy: {}: the shape {} has more than {} dimensions", path, text, Shape::kMaxRank);
    RETRACE_CHECK(dim == 0 || elements <= std::numeric_limits<std::int64_t>::max() / 8 / dim,
                  invalid_argument, "npy: {}: the shape {} has more elements than can be stored",
                  path, text);
    elements *= dim;
    rest.remove_prefix(digits);
  }
  return Shape(std::span<const std::int64_t>(dims));
}

}  // namespace

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RETRACE_CHECK(in.good(), invalid_argument, "npy: cannot open {}", path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  RETRACE_CHECK(bytes.size() >= 10 && std::string_view(bytes).substr(0, 6) == kMagic,
                invalid_argument, "npy: {} is not a .npy file (no \\x93NUMPY magic)", path);
  const auto major = static_cast<unsigned char>(bytes[6]);
  RETRACE_CHECK(major >= 1 && major <= 3, invalid_argument,
                "npy: {}: format version {}.{} (this reader knows 1 to 3)", path, major,
                static_cast<unsigned char>(bytes[7]));
  std::size_t header_length = 0, header_start = 10;
  if (major == 1) {
    header_length = static_cast<unsigned char>(bytes[8]) |
                    static_cast<std::size_t>(static_cast<unsigned char>(bytes[9])) << 8;
  } else {
    RETRACE_CHECK(bytes.size() >= 12, invalid_argument, "npy: {} is truncated in its header",
                  path);
    for (int i = 3; i >= 0; --i) {
      header_length = header_length << 8 | static_cast<unsigned char>(bytes[8 + i]);
    }
    header_start = 12;
  }
  RETRACE_CHECK(header_length <= bytes.size() - header_start, invalid_argument,
                "npy: {} is truncated: its header says {} bytes, the file has {} after the "
                "preamble",
                path, header_length, bytes.size() - header_start);
  const std::string_view header = std::string_view(bytes).substr(header_start, header_length);
  const std::string_view descr = header_value(header, "descr", path);
  const std::string_view fortran = header_value(header, "fortran_order", path);
  const Shape shape = parse_shape(header_value(header, "shape", path), path);
  RETRACE_CHECK(fortran == "False", invalid_argument,
                "npy: {}: fortran_order is {}; write it in C order (numpy.ascontiguousarray)",
                path, fortran);
  std::size_t element = 0;
  if (descr == "'<f4'" || descr == "'=f4'") element = 4;
  if (descr == "'<f8'" || descr == "'=f8'") element = 8;
  if (descr == "'<f2'" || descr == "'=f2'") element = 2;
  RETRACE_CHECK(element != 0, invalid_argument,
                "npy: {}: dtype {} is not one this reader takes (little-endian float32, float64 "
                "or float16)",
                path, descr);
  const auto count = static_cast<std::size_t>(shape.numel());
  const std::size_t data_start = header_start + header_length;
  RETRACE_CHECK(bytes.size() - data_start == count * element, invalid_argument,
                "npy: {}: {} values of {} bytes ({}) need {} bytes of data, the file has {}", path,
                count, element, shape, count * element, bytes.size() - data_start);
  std::vector<float> values(count);
  const char* data = bytes.data() + data_start;
  for (std::size_t i = 0; i < count; ++i) {
    if (element == 4) {
      std::memcpy(&values[i], data + 4 * i, 4);
    } else if (element == 8) {
      double v = 0;
      std::memcpy(&v, data + 8 * i, 8);
      values[i] = static_cast<float>(v);
    } else {
      std::uint16_t h = 0;
      std::memcpy(&h, data + 2 * i, 2);
      values[i] = float16::from_bits(h).to_float();
    }
  }
  return Tensor::from_vector<float>(values, shape, DType::float32);
}

void write_npy(const std::string& path, const Tensor& tensor) {
  const std::vector<float> values = tensor.to_vector<float>();
  const Shape& shape = tensor.shape();
  std::string dims;
  for (std::size_t i = 0; i < shape.rank(); ++i) dims += fmt::format("{}{}", i ? ", " : "", shape[i]);
  if (shape.rank() == 1) dims += ",";  // (5,), as Python writes a 1-tuple
  std::string header =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  // Padded with spaces and a newline so the data starts at a multiple of 64 bytes.
  const std::size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  RETRACE_CHECK(out.good(), invalid_argument, "npy: cannot create {}", path);
  out.write(kMagic.data(), static_cast<std::streamsize>(kMagic.size()));
  const std::array<char, 4> version_and_length{1, 0, static_cast<char>(header.size() & 0xff),
                                               static_cast<char>(header.size() >> 8)};
  out.write(version_and_length.data(), 4);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(float)));
  RETRACE_CHECK(out.good(), invalid_argument, "npy: writing {} failed", path);
}

}  // namespace retrace::models
