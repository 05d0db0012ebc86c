// A reader and writer for the .safetensors format (an 8-byte little-endian header length, a JSON
// header mapping names to {dtype, shape, data_offsets}, then the raw little-endian data), so
// real checkpoints can be loaded.
//
// The reader maps the file (mmap) instead of reading it: host tensors are views of the mapping
// (no copy; the mapping lives as long as any of them), and load_safetensors uploads tensor by
// tensor, dropping each one's pages once it is on the device, so loading a file of N bytes
// needs about N bytes of memory, not 2N. Everything is checked and errors name the tensor: a
// truncated file, a header over 100 MB or not valid JSON, duplicate names, shapes and offsets
// that are not non-negative integers, offsets outside the data or not matching the shape,
// tensors that overlap, an unsupported dtype.
//
//   auto host = retrace::models::read_safetensors("dit.safetensors");           // host views
//   auto weights = retrace::models::load_safetensors("dit.safetensors", device);  // on device
//   retrace::models::write_safetensors("out.safetensors", weights);
#pragma once

#include <retrace/tensor.hpp>

#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace retrace::models {

// The largest header the reader accepts (the format's own limit).
inline constexpr std::size_t kMaxSafetensorsHeaderBytes = 100'000'000;

// One tensor of a file: F32, BF16, F16, I32, U32 and U8 keep their dtype (F16 is float16).
struct SafetensorsEntry {
  std::string name;
  std::string file_dtype;            // "F32", "F16", ...
  DType dtype = DType::float32;      // the tensor's dtype once read
  Shape shape;
  std::span<const std::byte> bytes;  // the tensor's data in the file
};

// A parsed file: its entries (sorted by name) over the file's bytes.
class SafetensorsFile {
 public:
  // Maps and parses the file at `path`.
  [[nodiscard]] static SafetensorsFile open(const std::string& path);
  // Parses bytes the caller keeps alive while the result is used; `label` names them in errors.
  [[nodiscard]] static SafetensorsFile parse(std::span<const std::byte> bytes,
                                             const std::string& label = "<memory>");

  [[nodiscard]] const std::vector<SafetensorsEntry>& entries() const noexcept { return entries_; }
  // A host tensor of an entry: a view of the file when its data is aligned for its dtype,
  // otherwise (and for F16, converted to float32) a copy.
  [[nodiscard]] Tensor host_tensor(const SafetensorsEntry& entry) const;
  // Lets the operating system drop the entry's pages from memory (they are read again from the
  // file if used, and changes made through a host tensor view of the entry are lost); a no-op
  // for parsed bytes.
  void release_pages(const SafetensorsEntry& entry) const noexcept;

 private:
  std::string label_;
  std::shared_ptr<const std::byte> storage_;  // the mapping (null for parsed bytes)
  std::size_t storage_bytes_ = 0;
  std::vector<SafetensorsEntry> entries_;
};

// Host tensors by name, viewing the mapped file (see SafetensorsFile::host_tensor).
[[nodiscard]] std::map<std::string, Tensor> read_safetensors(const std::string& path);
// Device tensors by name, uploaded one by one; peak memory stays close to the file's size.
[[nodiscard]] std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                                             Device& device);
// Streams the tensors to `path`, one at a time (row-major; device tensors are read back first),
// back to back in name order as the format asks; the header is padded with spaces to a multiple
// of 8 bytes, so the data starts aligned.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors);

}  // namespace retrace::models
