#include "retrace/models/safetensors.hpp"

#include <nlohmann/json.hpp>
#include <retrace/error.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>

namespace retrace::models {

namespace {

struct FileType {
  const char* name;
  DType dtype;       // the dtype of the tensor read
  std::size_t size;  // bytes per element in the file
};
constexpr FileType kTypes[] = {{"F32", DType::float32, 4}, {"BF16", DType::bfloat16, 2},
                               {"I32", DType::int32, 4},   {"U32", DType::uint32, 4},
                               {"U8", DType::uint8, 1},    {"F16", DType::float16, 2}};

const FileType* find_type(std::string_view name) {
  for (const FileType& t : kTypes) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

// The file mapped copy-on-write: writes through a host tensor never reach the file.
std::shared_ptr<const std::byte> map_file(const std::string& path, std::size_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  RETRACE_CHECK(fd >= 0, invalid_argument, "safetensors: cannot open {}: {}", path,
                std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    RETRACE_FAIL(invalid_argument, "safetensors: {} is not a regular file", path);
  }
  size = static_cast<std::size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    RETRACE_FAIL(invalid_argument,
                 "safetensors: {} is truncated: {} bytes, not even the 8-byte header length",
                 path, size);
  }
  void* mapped = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  const int error = errno;
  ::close(fd);
  RETRACE_CHECK(mapped != MAP_FAILED, out_of_memory, "safetensors: cannot map {} ({} bytes): {}",
                path, size, std::strerror(error));
  const std::size_t length = size;
  return std::shared_ptr<const std::byte>(static_cast<const std::byte*>(mapped),
                                          [length](const std::byte* p) {
                                            ::munmap(const_cast<std::byte*>(p), length);
                                          });
}

// A JSON value that must be a non-negative integer (not 2.0, not -1, not "3").
std::uint64_t integral(const nlohmann::json& value, const std::string& label,
                       const std::string& name, std::string_view field) {
  RETRACE_CHECK(value.is_number_unsigned(), invalid_argument,
                "safetensors: {}: tensor \"{}\": {} must hold non-negative integers, found {}",
                label, name, field, value.dump());
  return value.get<std::uint64_t>();
}

struct Range {
  std::size_t begin, end, entry;
};

SafetensorsEntry parse_entry(const std::string& label, const std::string& name,
                             const nlohmann::json& entry, std::span<const std::byte> data) {
  RETRACE_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                    entry.contains("data_offsets"),
                invalid_argument,
                "safetensors: {}: tensor \"{}\" needs dtype, shape and data_offsets", label, name);
  const nlohmann::json& dtype = entry["dtype"];
  RETRACE_CHECK(dtype.is_string(), invalid_argument,
                "safetensors: {}: tensor \"{}\": dtype must be a string, found {}", label, name,
                dtype.dump());
  const FileType* type = find_type(dtype.get_ref<const std::string&>());
  RETRACE_CHECK(type != nullptr, invalid_argument,
                "safetensors: {}: tensor \"{}\" has dtype {}; supported: F32, BF16, F16, I32, "
                "U32, U8",
                label, name, dtype.get_ref<const std::string&>());
  const nlohmann::json& shape_json = entry["shape"];
  RETRACE_CHECK(shape_json.is_array() && shape_json.size() <= Shape::kMaxRank, invalid_argument,
                "safetensors: {}: tensor \"{}\": shape must be an array of at most {} extents",
                label, name, Shape::kMaxRank);
  std::vector<std::int64_t> dims;
  for (const nlohmann::json& d : shape_json) {
    const std::uint64_t extent = integral(d, label, name, "shape");
    RETRACE_CHECK(extent <= static_cast<std::uint64_t>(INT64_MAX), invalid_argument,
                  "safetensors: {}: tensor \"{}\" has an extent of {}", label, name, extent);
    dims.push_back(static_cast<std::int64_t>(extent));
  }
  const nlohmann::json& offsets = entry["data_offsets"];
  RETRACE_CHECK(offsets.is_array() && offsets.size() == 2, invalid_argument,
                "safetensors: {}: tensor \"{}\": data_offsets must be [begin, end]", label, name);
  const std::uint64_t begin = integral(offsets[0], label, name, "data_offsets");
  const std::uint64_t end = integral(offsets[1], label, name, "data_offsets");
  RETRACE_CHECK(begin <= end && end <= data.size(), invalid_argument,
                "safetensors: {}: tensor \"{}\" has data_offsets outside the {} bytes of data: "
                "[{}, {}]",
                label, name, data.size(), begin, end);
  SafetensorsEntry result;
  result.name = name;
  result.file_dtype = type->name;
  result.dtype = type->dtype;
  try {
    result.shape = Shape(std::span<const std::int64_t>(dims));
  } catch (const Error& e) {
    RETRACE_FAIL(invalid_argument, "safetensors: {}: tensor \"{}\": {}", label, name, e.message());
  }
  std::uint64_t needed = 0;
  const bool overflows = __builtin_mul_overflow(static_cast<std::uint64_t>(result.shape.numel()),
                                                std::uint64_t{type->size}, &needed);
  RETRACE_CHECK(!overflows && needed == end - begin, invalid_argument,
                "safetensors: {}: tensor \"{}\" has {} bytes of data but shape {} of {} needs {}",
                label, name, end - begin, result.shape, type->name,
                overflows ? std::string("more than 2^64") : std::to_string(needed));
  result.bytes = data.subspan(begin, end - begin);
  return result;
}

std::vector<SafetensorsEntry> parse_file(std::span<const std::byte> file,
                                         const std::string& label) {
  RETRACE_CHECK(file.size() >= 8, invalid_argument,
                "safetensors: {} is truncated: {} bytes, not even the 8-byte header length",
                label, file.size());
  std::uint64_t header_size = 0;  // little-endian in the file
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | std::to_integer<std::uint64_t>(file[i]);
  RETRACE_CHECK(header_size <= kMaxSafetensorsHeaderBytes, invalid_argument,
                "safetensors: {}: the header claims {} bytes, more than the limit of {}", label,
                header_size, kMaxSafetensorsHeaderBytes);
  RETRACE_CHECK(header_size <= file.size() - 8, invalid_argument,
                "safetensors: {} is truncated: the header claims {} bytes, the file has {} after "
                "the length",
                label, header_size, file.size() - 8);
  const auto* text = reinterpret_cast<const char*>(file.data() + 8);
  std::set<std::string> names;
  std::string duplicate;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(
        text, text + header_size,
        [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          if (depth == 1 && event == nlohmann::json::parse_event_t::key &&
              !names.insert(parsed.get<std::string>()).second && duplicate.empty()) {
            duplicate = parsed.get<std::string>();
          }
          return true;
        });
  } catch (const nlohmann::json::exception& e) {
    RETRACE_FAIL(invalid_argument, "safetensors: {}: the header is not valid JSON: {}", label,
                 e.what());
  }
  RETRACE_CHECK(header.is_object(), invalid_argument,
                "safetensors: {}: the header is not a JSON object", label);
  RETRACE_CHECK(duplicate.empty(), invalid_argument,
                "safetensors: {}: tensor \"{}\" appears twice in the header", label, duplicate);
  const std::span<const std::byte> data = file.subspan(8 + header_size);
  std::vector<SafetensorsEntry> entries;
  std::vector<Range> ranges;
  entries.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      RETRACE_CHECK(entry.is_object(), invalid_argument,
                    "safetensors: {}: __metadata__ must be an object", label);
      continue;
    }
    entries.push_back(parse_entry(label, name, entry, data));
    const SafetensorsEntry& added = entries.back();
    const auto begin = static_cast<std::size_t>(added.bytes.data() - data.data());
    if (!added.bytes.empty()) ranges.push_back({begin, begin + added.bytes.size(), entries.size() - 1});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    const Range& a = ranges[i - 1];
    const Range& b = ranges[i];
    RETRACE_CHECK(b.begin >= a.end, invalid_argument,
                  "safetensors: {}: tensors \"{}\" (bytes [{}, {})) and \"{}\" (bytes [{}, {})) "
                  "overlap",
                  label, entries[a.entry].name, a.begin, a.end, entries[b.entry].name, b.begin,
                  b.end);
  }
  return entries;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.label_ = path;
  file.storage_ = map_file(path, file.storage_bytes_);
  file.entries_ = parse_file(std::span(file.storage_.get(), file.storage_bytes_), path);
  return file;
}

SafetensorsFile SafetensorsFile::parse(std::span<const std::byte> bytes, const std::string& label) {
  SafetensorsFile file;
  file.label_ = label;
  file.entries_ = parse_file(bytes, label);
  return file;
}

Tensor SafetensorsFile::host_tensor(const SafetensorsEntry& entry) const {
  const std::byte* src = entry.bytes.data();
  const bool aligned = reinterpret_cast<std::uintptr_t>(src) % dtype_size(entry.dtype) == 0;
  if (storage_ != nullptr && aligned && !entry.bytes.empty()) {
    // A view: shares ownership of the mapping.
    std::shared_ptr<std::byte> view(std::const_pointer_cast<std::byte>(storage_),
                                    const_cast<std::byte*>(src));
    return Tensor::from_host_storage(std::move(view), entry.shape, entry.dtype);
  }
  Tensor tensor = Tensor::empty_host(entry.shape, entry.dtype);
  if (!entry.bytes.empty()) {
    std::memcpy(tensor.host_bytes_mutable().data(), src, entry.bytes.size());
  }
  return tensor;
}

void SafetensorsFile::release_pages(const SafetensorsEntry& entry) const noexcept {
  if (storage_ == nullptr || entry.bytes.empty()) return;
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(entry.bytes.data());
  const std::uintptr_t first = (begin + page - 1) / page * page;
  const std::uintptr_t last = (begin + entry.bytes.size()) / page * page;
  if (last > first) {
    (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
}

std::map<std::string, Tensor> read_safetensors(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, Tensor> tensors;
  for (const SafetensorsEntry& entry : file.entries()) {
    tensors.emplace(entry.name, file.host_tensor(entry));
  }
  return tensors;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path, Device& device) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, Tensor> tensors;
  for (const SafetensorsEntry& entry : file.entries()) {
    tensors.emplace(entry.name, file.host_tensor(entry).to_device(device));
    file.release_pages(entry);
  }
  return tensors;
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    tensor.check_not_null("write_safetensors", name);
    RETRACE_CHECK(tensor.layout() == Layout::row_major, invalid_argument,
                  "write_safetensors: tensor \"{}\" is in tile layout; convert it to row_major",
                  name);
    const char* type = nullptr;
    for (const FileType& t : kTypes) {
      if (t.dtype == tensor.dtype() && t.size == dtype_size(tensor.dtype())) {
        type = t.name;
        break;
      }
    }
    const std::size_t bytes = tensor.nbytes();
    header[name] = {{"dtype", type},
                    {"shape", std::vector<std::int64_t>(tensor.shape().dims().begin(),
                                                        tensor.shape().dims().end())},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 8 + 7) / 8 * 8 - 8, ' ');  // data starts 8-byte aligned
  const std::uint64_t size = text.size();
  std::ofstream out(path, std::ios::binary);
  RETRACE_CHECK(out.good(), invalid_argument, "write_safetensors: cannot create {}", path);
  out.write(reinterpret_cast<const char*>(&size), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& [name, tensor] : tensors) {  // one tensor in host memory at a time
    const Tensor host = tensor.to_host();
    const auto bytes = host.host_bytes();
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  RETRACE_CHECK(out.good(), invalid_argument, "write_safetensors: writing {} failed", path);
}

}  // namespace retrace::models
