// .npy files (the demo's --noise and --save-latents): round trips of every rank, the dtypes and
// versions numpy writes, and each malformed file rejected with an error naming what is wrong.
#include "support.hpp"

#include <retrace/models/npy.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

namespace retrace {
namespace {

class NpyTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const {
    return (std::filesystem::temp_directory_path() /
            ("retrace_test_npy_" + std::to_string(::getpid()) + "_" + name))
        .string();
  }
  void TearDown() override {
    for (const auto& p : written_) std::filesystem::remove(p);
  }
  // A file of a preamble (version, header) and raw data, as numpy or a fuzzer would write it.
  std::string file(const std::string& name, const std::string& header, const std::string& data,
                   int major = 1) {
    std::string bytes("\x93NUMPY", 6);
    bytes.push_back(static_cast<char>(major));
    bytes.push_back(0);
    const std::size_t length = header.size();
    bytes.push_back(static_cast<char>(length & 0xff));
    bytes.push_back(static_cast<char>((length >> 8) & 0xff));
    if (major >= 2) {
      bytes.push_back(static_cast<char>((length >> 16) & 0xff));
      bytes.push_back(static_cast<char>((length >> 24) & 0xff));
    }
    return raw(name, bytes + header + data);
  }
  std::string raw(const std::string& name, const std::string& bytes) {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary) << bytes;
    written_.push_back(p);
    return p;
  }
  std::vector<std::string> written_;
};

std::string floats(std::initializer_list<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

TEST_F(NpyTest, RoundTripsEveryRank) {
  auto device = open_cpu_device();
  for (const Shape& shape : {Shape{}, Shape{5}, Shape{1, 4, 3, 2}, Shape{2, 0, 3},
                             Shape{1, 1, 1, 1, 1, 1, 1, 2}}) {
    auto values = testing::random_floats(static_cast<std::size_t>(shape.numel()), 4);
    if (!values.empty()) values[0] = std::numeric_limits<float>::quiet_NaN();
    const Tensor t = testing::device_tensor(*device, values, shape);
    const std::string p = path("round_trip.npy");
    written_.push_back(p);
    models::write_npy(p, t);
    const Tensor back = models::read_npy(p);
    EXPECT_EQ(back.shape(), shape);
    EXPECT_EQ(back.dtype(), DType::float32);
    EXPECT_EQ(testing::float_bits(back), testing::float_bits(t)) << shape.to_string();
    // The data starts on a 64-byte boundary, as numpy aligns it.
    EXPECT_EQ((std::filesystem::file_size(p) - values.size() * 4) % 64, 0u) << shape.to_string();
  }
}

TEST_F(NpyTest, ReadsWhatNumpyWrites) {
  // numpy.save of float32, float64 and float16 arrays, a version 2.0 header, Python 2's 2L.
  const std::string pad(10, ' ');
  auto read = [](const std::string& p) { return models::read_npy(p).to_vector<float>(); };
  EXPECT_EQ(read(file("f4.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }" + pad + "\n",
                      floats({1.5f, -2.0f}))),
            (std::vector<float>{1.5f, -2.0f}));
  double d[2] = {0.1, 1e300};
  std::string f8(16, '\0');
  std::memcpy(f8.data(), d, 16);
  EXPECT_EQ(read(file("f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }\n", f8)),
            (std::vector<float>{0.1f, std::numeric_limits<float>::infinity()}));
  const std::string f2("\x00\x3c\x00\xc0", 4);  // 1.0, -2.0
  EXPECT_EQ(read(file("f2.npy", "{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }\n", f2)),
            (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(read(file("v2.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1L, 1L), }\n",
                      floats({3.0f}), 2)),
            (std::vector<float>{3.0f}));
  EXPECT_EQ(models::read_npy(file("scalar.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }\n",
                                  floats({7.0f})))
                .shape(),
            Shape{});
}

TEST_F(NpyTest, MalformedFilesAreErrorsNamingWhatIsWrong) {
  const auto expect = [](const std::string& p, const std::string& needle) {
    testing::expect_error([&] { (void)models::read_npy(p); }, ErrorCategory::invalid_argument,
                          needle);
  };
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
  expect(path("missing.npy"), "npy: cannot open");
  expect(raw("empty.npy", ""), "is not a .npy file (no \\x93NUMPY magic)");
  expect(raw("magic.npy", "\x93NUMPX\x01\x00\x00\x00"), "no \\x93NUMPY magic");
  expect(file("version.npy", good, floats({1, 2}), 4), "format version 4.0 (this reader knows 1 to 3)");
  expect(raw("short_header.npy", std::string("\x93NUMPY\x01\x00\xff\x00{'descr'", 17)),
         "is truncated: its header says 255 bytes");
  expect(raw("short_v2.npy", std::string("\x93NUMPY\x02\x00\x01\x00", 10)), "truncated in its header");
  expect(file("no_descr.npy", "{'fortran_order': False, 'shape': (2,), }\n", floats({1, 2})),
         "the header has no 'descr'");
  expect(file("no_shape.npy", "{'descr': '<f4', 'fortran_order': False, }\n", floats({1, 2})),
         "the header has no 'shape'");
  expect(file("int.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n", floats({1, 2})),
         "dtype '<i4' is not one this reader takes");
  expect(file("big.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }\n", floats({1, 2})),
         "dtype '>f4'");
  expect(file("fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }\n", floats({1, 2})),
         "fortran_order is True");
  expect(file("shape_text.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': [2], }\n", floats({1, 2})),
         "the shape [2] is not a tuple");
  expect(file("shape_neg.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }\n", floats({1, 2})),
         "is not a tuple of whole numbers");
  expect(file("shape_huge.npy",
              "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", ""),
         "has a size too large");
  expect(file("shape_overflow.npy",
              "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n", ""),
         "has more elements than can be stored");
  expect(file("rank.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1), }\n", ""),
         "has more than 8 dimensions");
  expect(file("short_data.npy", good, floats({1})), "need 8 bytes of data, the file has 4");
  expect(file("long_data.npy", good, floats({1, 2, 3})), "need 8 bytes of data, the file has 12");
  testing::expect_error([&] { models::write_npy("/nonexistent-dir/x.npy", Tensor::from_vector<float>(std::vector<float>{1.0f}, {1}, DType::float32)); },
                        ErrorCategory::invalid_argument, "npy: cannot create /nonexistent-dir/x.npy");
}

}  // namespace
}  // namespace retrace
