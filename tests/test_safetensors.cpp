// The safetensors reader: strict about what it accepts, zero-copy over a mapped file, and never
// crashing on malformed input (a structured mutation test, run under ASan+UBSan by the asan
// preset), with its peak memory measured on a 256 MiB file.
#include "safetensors_check.hpp"
#include "support.hpp"

#include <retrace/models/safetensors.hpp>

#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

namespace retrace {
namespace {

using models::SafetensorsFile;

std::vector<std::byte> file_bytes(const std::string& header, const std::string& data) {
  std::vector<std::byte> bytes(8 + header.size() + data.size());
  const std::uint64_t size = header.size();
  std::memcpy(bytes.data(), &size, 8);
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(bytes.data() + 8 + header.size(), data.data(), data.size());
  return bytes;
}

SafetensorsFile parse(const std::string& header, std::size_t data_bytes) {
  const auto bytes = file_bytes(header, std::string(data_bytes, '\0'));
  return SafetensorsFile::parse(bytes, "test");  // entries are not read after the bytes die
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":{}}})", name, dtype, shape,
                     offsets);
}

// A header object of entries: {e1,e2,...}.
std::string object(std::initializer_list<std::string> entries) {
  return fmt::format("{{{}}}", fmt::join(entries, ","));
}

std::string scratch(const std::string& name) {
  return (std::filesystem::path(testing::scratch_dir("retrace_safetensors_reader_test")) / name)
      .string();
}

TEST(SafetensorsReaderTest, OnlyIntegralNumbersForShapesAndOffsets) {
  const auto bad = [](const std::string& shape, const std::string& offsets) {
    return object({entry("w", "F32", shape, offsets)});
  };
  EXPECT_RETRACE_ERROR((void)parse(bad("[2.0]", "[0,8]"), 8), invalid_argument,
                       "tensor \"w\": shape must hold non-negative integers, found 2.0");
  EXPECT_RETRACE_ERROR((void)parse(bad("[-2]", "[0,8]"), 8), invalid_argument,
                       "found -2");
  EXPECT_RETRACE_ERROR((void)parse(bad("[\"2\"]", "[0,8]"), 8), invalid_argument,
                       "found \"2\"");
  EXPECT_RETRACE_ERROR((void)parse(bad("[2]", "[0,8.0]"), 8), invalid_argument,
                       "data_offsets must hold non-negative integers, found 8.0");
  EXPECT_RETRACE_ERROR((void)parse(bad("[2]", "[0,1e1]"), 8), invalid_argument, "found 10.0");
  EXPECT_RETRACE_ERROR((void)parse(bad("[2]", "[0,99999999999999999999999]"), 8),
                       invalid_argument, "data_offsets must hold non-negative integers");
  EXPECT_RETRACE_ERROR((void)parse(bad("[2]", "[0,8,16]"), 8), invalid_argument,
                       "data_offsets must be [begin, end]");
  EXPECT_RETRACE_ERROR((void)parse(bad("[1,1,1,1,1,1,1,1,2]", "[0,8]"), 8), invalid_argument,
                       "at most 8 extents");
  EXPECT_RETRACE_ERROR((void)parse(bad("[4611686018427387904,4]", "[0,8]"), 8),
                       invalid_argument, "tensor \"w\": shape [4611686018427387904, 4]");
  EXPECT_RETRACE_ERROR((void)parse(bad("[4611686018427387904]", "[0,8]"), 8), invalid_argument,
                       "needs more than 2^64");
  EXPECT_EQ(parse(bad("[2]", "[0,8]"), 8).entries().size(), 1u);
}

TEST(SafetensorsReaderTest, DuplicateNamesAndOverlapsAreRejected) {
  EXPECT_RETRACE_ERROR(
      (void)parse(object({entry("w", "F32", "[1]", "[0,4]"), entry("w", "F32", "[1]", "[4,8]")}),
                  8),
      invalid_argument, "tensor \"w\" appears twice");
  EXPECT_RETRACE_ERROR(
      (void)parse(object({entry("a", "F32", "[2]", "[0,8]"), entry("b", "F32", "[2]", "[4,12]")}),
                  12),
      invalid_argument, "tensors \"a\" (bytes [0, 8)) and \"b\" (bytes [4, 12)) overlap");
  EXPECT_RETRACE_ERROR(
      (void)parse(object({entry("a", "U8", "[4]", "[0,4]"), entry("b", "U8", "[2]", "[1,3]")}),
                  4),
      invalid_argument, "overlap");
  // Touching is fine, and empty tensors overlap nothing.
  const auto file = parse(object({entry("a", "F32", "[1]", "[0,4]"), entry("b", "F32", "[1]", "[4,8]"), entry("e", "F32", "[0, 3]", "[4,4]")}),
                          8);
  EXPECT_EQ(file.entries().size(), 3u);
}

TEST(SafetensorsReaderTest, HeadersOverOneHundredMegabytesAreRejected) {
  std::vector<std::byte> bytes(64, std::byte{' '});
  const std::uint64_t claimed = models::kMaxSafetensorsHeaderBytes + 1;
  std::memcpy(bytes.data(), &claimed, 8);
  EXPECT_RETRACE_ERROR((void)SafetensorsFile::parse(bytes, "big"), invalid_argument,
                       "more than the limit of 100000000");
  EXPECT_RETRACE_ERROR((void)parse("{\"__metadata__\":[1]}", 0), invalid_argument,
                       "__metadata__ must be an object");
  EXPECT_RETRACE_ERROR((void)parse("[1, 2]", 0), invalid_argument, "not a JSON object");
}

TEST(SafetensorsReaderTest, ZeroElementTensorsRoundTrip) {
  auto device = open_cpu_device();
  std::map<std::string, Tensor> tensors;
  tensors["empty"] = Tensor::from_vector<float>(std::vector<float>{}, {0, 4}, DType::float32);
  tensors["empty_device"] = ops::full({3, 0}, 1.0, *device, DType::bfloat16);
  tensors["one"] = Tensor::from_vector<float>({7.0f}, {1}, DType::float32);
  const std::string path = scratch("empty.safetensors");
  models::write_safetensors(path, tensors);
  const auto host = models::read_safetensors(path);
  EXPECT_EQ(host.at("empty").shape(), (Shape{0, 4}));
  EXPECT_TRUE(host.at("empty").to_vector<float>().empty());
  EXPECT_EQ(host.at("empty_device").dtype(), DType::bfloat16);
  const auto loaded = models::load_safetensors(path, *device);
  EXPECT_TRUE(loaded.at("empty").on_device());
  EXPECT_TRUE(loaded.at("empty").to_vector<float>().empty());
  EXPECT_EQ(loaded.at("one").to_vector<float>(), std::vector<float>{7.0f});
}

// F16 tensors are float16 tensors (the bits unchanged), written back as F16.
TEST(SafetensorsReaderTest, F16TensorsKeepTheirDType) {
  std::map<std::string, Tensor> tensors;
  tensors["w"] = Tensor::from_vector<float>({1.5f, -65504.0f, std::ldexp(1.0f, -24)}, {3},
                                            DType::float16);
  const std::string path = scratch("f16.safetensors");
  models::write_safetensors(path, tensors);
  const auto back = models::read_safetensors(path);
  ASSERT_EQ(back.at("w").dtype(), DType::float16);
  EXPECT_EQ(back.at("w").to_vector<float>(),
            (std::vector<float>{1.5f, -65504.0f, std::ldexp(1.0f, -24)}));
  auto device = open_cpu_device();
  EXPECT_EQ(models::load_safetensors(path, *device).at("w").dtype(), DType::float16);
}

TEST(SafetensorsReaderTest, HostTensorsViewTheFileWithoutChangingIt) {
  std::map<std::string, Tensor> tensors;
  tensors["w"] = Tensor::from_vector<float>({1.0f, 2.0f, 3.0f, 4.0f}, {4}, DType::float32);
  const std::string path = scratch("view.safetensors");
  models::write_safetensors(path, tensors);
  {
    auto host = models::read_safetensors(path);
    Tensor w = host.at("w");
    host.clear();  // the view keeps the mapping alive
    EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
    w.host_bytes_mutable()[0] = std::byte{0xff};  // copy-on-write: the file is untouched
  }
  EXPECT_EQ(models::read_safetensors(path).at("w").to_vector<float>(),
            (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
}

TEST(SafetensorsReaderTest, UnalignedDataIsCopiedNotViewed) {
  // A 3-byte U8 tensor first puts the F32 tensor at an odd offset.
  const std::string header = object({entry("a", "U8", "[3]", "[0,3]"), entry("b", "F32", "[2]", "[3,11]")});
  std::string data(11, '\0');
  const float values[2] = {1.5f, -2.0f};
  std::memcpy(data.data() + 3, values, 8);
  const std::string path = scratch("unaligned.safetensors");
  const auto bytes = file_bytes(header, data);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  EXPECT_EQ(models::read_safetensors(path).at("b").to_vector<float>(),
            (std::vector<float>{1.5f, -2.0f}));
}

// A valid file to mutate: several dtypes, an empty tensor, metadata.
std::vector<std::byte> seed_file() {
  const std::string header =
      object({R"("__metadata__":{"format":"pt"})", entry("a.weight", "F32", "[2,3]", "[0,24]"),
              entry("b", "BF16", "[4]", "[24,32]"), entry("c", "F16", "[2]", "[32,36]"),
              entry("d", "I32", "[1]", "[36,40]"), entry("e", "U8", "[0,5]", "[40,40]"),
              entry("f", "U32", "[2,1]", "[40,48]")});
  std::string data(48, '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 37 + 11);
  return file_bytes(header, data);
}

// One structured mutation: what a fuzzer (or a damaged download) produces.
std::vector<std::byte> mutate(std::vector<std::byte> bytes, std::mt19937_64& rng) {
  auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  static const char* const kTokens[] = {
      "-1", "0", "2.5", "1e300", "18446744073709551616", "9223372036854775807", "[]", "{}",
      "null", "\"F64\"", "\"BF16\"", "[0,0]", "[4294967296,4294967296]", "\"a.weight\"",
      "\"data_offsets\"", "\"shape\"", ",", ":", "[", "]", "{", "}", "\"", "\\u0000", "true"};
  const std::uint64_t header_size = [&] {
    std::uint64_t h = 0;
    std::memcpy(&h, bytes.data(), 8);
    return h;
  }();
  const std::size_t header_end = std::min<std::size_t>(8 + header_size, bytes.size());
  switch (rng() % 8) {
    case 0:  // flip bits anywhere
      for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i) {
        bytes[pick(bytes.size())] ^= std::byte{static_cast<unsigned char>(1u << (rng() % 8))};
      }
      break;
    case 1:  // truncate
      bytes.resize(pick(bytes.size()));
      break;
    case 2: {  // a new header length, small or absurd
      const std::uint64_t lengths[] = {0, 1, header_size - 1, header_size + 1, bytes.size(),
                                       std::uint64_t{1} << 40, ~std::uint64_t{0}, rng()};
      const std::uint64_t h = lengths[pick(std::size(lengths))];
      if (bytes.size() >= 8) std::memcpy(bytes.data(), &h, 8);
      break;
    }
    case 3:
    case 4: {  // replace a header byte range with a JSON-ish token, keeping the length right
      if (header_end <= 8) break;
      const std::size_t at = 8 + pick(header_end - 8);
      const std::size_t len = std::min<std::size_t>(1 + pick(6), header_end - at);
      const std::string token = kTokens[pick(std::size(kTokens))];
      bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                  bytes.begin() + static_cast<std::ptrdiff_t>(at + len));
      bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                   reinterpret_cast<const std::byte*>(token.data()),
                   reinterpret_cast<const std::byte*>(token.data() + token.size()));
      const std::uint64_t h = header_size - len + token.size();
      std::memcpy(bytes.data(), &h, 8);
      break;
    }
    case 5: {  // rewrite a digit in the header (shapes and offsets)
      std::vector<std::size_t> digits;
      for (std::size_t i = 8; i < header_end; ++i) {
        if (std::isdigit(static_cast<unsigned char>(bytes[i]))) digits.push_back(i);
      }
      if (!digits.empty()) bytes[digits[pick(digits.size())]] = std::byte('0' + rng() % 10);
      break;
    }
    case 6: {  // duplicate a slice of the header (duplicate keys, nesting)
      if (header_end <= 9) break;
      const std::size_t at = 8 + pick(header_end - 8);
      const std::size_t len = std::min<std::size_t>(1 + pick(40), header_end - at);
      std::vector<std::byte> slice(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                                   bytes.begin() + static_cast<std::ptrdiff_t>(at + len));
      bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at), slice.begin(), slice.end());
      const std::uint64_t h = header_size + len;
      std::memcpy(bytes.data(), &h, 8);
      break;
    }
    default:  // grow or shrink the data
      bytes.resize(rng() % 2 ? bytes.size() + pick(64) : header_end + pick(bytes.size() - header_end + 1));
      break;
  }
  return bytes;
}

// Thousands of malformed files, bounded in time: each is accepted consistently or rejected
// with invalid_argument; ASan and UBSan (asan preset) check the reader never reads out of bounds.
TEST(SafetensorsFuzzTest, ThousandsOfMalformedFilesAreRejectedCleanly) {
  std::mt19937_64 rng(testing::test_seed() ^ 0x5afe7e45u);
  const std::vector<std::byte> seed = seed_file();
  ASSERT_TRUE(testing::check_safetensors_bytes(seed));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::size_t runs = 0, accepted = 0;
  for (; runs < 20000 && std::chrono::steady_clock::now() < deadline; ++runs) {
    std::vector<std::byte> bytes = seed;
    for (int i = 0, n = 1 + static_cast<int>(rng() % 3); i < n; ++i) bytes = mutate(std::move(bytes), rng);
    try {
      accepted += testing::check_safetensors_bytes(bytes) ? 1 : 0;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "run " << runs << ": " << e.what();
      break;
    }
  }
  std::printf("[retrace] %zu mutated files: %zu accepted, %zu rejected\n", runs, accepted,
              runs - accepted);
  EXPECT_GE(runs, 2000u);
  EXPECT_GT(runs - accepted, runs / 2);
}

// Peak resident memory while loading, in this process (VmHWM after resetting it).
std::size_t status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field)));
  }
  return 0;
}

bool reset_peak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  return static_cast<bool>(clear.flush());
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

TEST(SafetensorsMemoryTest, LoadingAFileOfNBytesPeaksNearNBytes) {
  if (kSanitized) GTEST_SKIP() << "sanitizer shadow memory distorts resident sizes";
  if (!reset_peak()) GTEST_SKIP() << "/proc/self/clear_refs is not writable here";
  constexpr std::size_t kTensors = 16;
  constexpr std::int64_t kFloats = 4 << 20;  // 16 MiB each, 256 MiB in all
  const std::string path = scratch("big.safetensors");
  {
    std::map<std::string, Tensor> tensors;
    Tensor block = Tensor::from_vector<float>(std::vector<float>(kFloats, 0.25f), {kFloats},
                                              DType::float32);
    for (std::size_t i = 0; i < kTensors; ++i) tensors[fmt::format("t{:02}", i)] = block;
    models::write_safetensors(path, tensors);
  }
  const double file_mib =
      static_cast<double>(std::filesystem::file_size(path)) / (1024.0 * 1024.0);
  CpuDeviceOptions options;
  options.memory_bytes = std::size_t{512} << 20;
  auto device = open_cpu_device(options);

  ASSERT_TRUE(reset_peak());
  const std::size_t base_host = status_kib("VmRSS:");
  double host_sum = 0.0;
  {
    const auto host = models::read_safetensors(path);
    for (const auto& [name, t] : host) host_sum += static_cast<double>(t.to_vector<float>()[1]);
  }
  const double host_peak_mib = static_cast<double>(status_kib("VmHWM:") - base_host) / 1024.0;

  ASSERT_TRUE(reset_peak());
  const std::size_t base_device = status_kib("VmRSS:");
  const auto loaded = models::load_safetensors(path, *device);
  const double device_peak_mib = static_cast<double>(status_kib("VmHWM:") - base_device) / 1024.0;
  EXPECT_EQ(loaded.size(), kTensors);
  EXPECT_EQ(loaded.at("t07").to_vector<float>()[kFloats - 1], 0.25f);
  EXPECT_EQ(host_sum, 0.25 * kTensors);

  std::printf("[retrace] safetensors file %.1f MiB: read_safetensors peak %.1f MiB (%.2fx), "
              "load_safetensors onto cpu:0 peak %.1f MiB (%.2fx)\n",
              file_mib, host_peak_mib, host_peak_mib / file_mib, device_peak_mib,
              device_peak_mib / file_mib);
  RecordProperty("load_peak_over_file", fmt::format("{:.3f}", device_peak_mib / file_mib));
  EXPECT_LT(device_peak_mib, 1.25 * file_mib);  // the device copy, plus a tensor or two in flight
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace retrace
