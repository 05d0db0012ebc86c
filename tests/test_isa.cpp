// CPU kernel variants: detection, the preference table, the choice between option, environment
// and automatic, and the errors for names a build lacks or a CPU cannot run. (The variants'
// results are compared in test_backend_ops.cpp; CTest also runs the op, tracer and model suites
// with RETRACE_CPU_ISA forced to each variant.)
#include "cpu/isa.hpp"
#include "support.hpp"

#include <cstdlib>

namespace retrace::cpu {
namespace {

CpuInfo fake_cpu(std::string vendor, bool v3, bool v4) {
  CpuInfo cpu;
  cpu.vendor = std::move(vendor);
  cpu.brand = "Test CPU";
  cpu.x86_64 = true;
  cpu.missing_v3 = v3 ? "" : "avx2, fma";
  cpu.missing_v4 = v4 ? "" : "avx512f";
  return cpu;
}

TEST(CpuIsaTest, BuildListsVariantsNarrowestFirst) {
  const auto variants = built_variants();
  ASSERT_FALSE(variants.empty());
#if defined(__x86_64__)
  ASSERT_EQ(variants.size(), 3u);
  EXPECT_EQ(variants[0].name, "x86-64");
  EXPECT_EQ(variants[1].name, "avx2");
  EXPECT_EQ(variants[1].march, "x86-64-v3");
  EXPECT_EQ(variants[2].name, "avx512");
  EXPECT_EQ(variants[2].march, "x86-64-v4");
#endif
  for (const VariantInfo& v : variants) {
    const KernelVariant* kernels = v.entry();
    ASSERT_NE(kernels, nullptr);
    EXPECT_EQ(std::string_view(kernels->name), v.name);
    for (std::size_t k = 0; k < kKernelCount; ++k) {
      EXPECT_TRUE(kernels->supports(static_cast<KernelId>(k))) << v.name << " kernel " << k;
    }
  }
}

#if defined(__x86_64__)
TEST(CpuIsaTest, DetectionAgreesWithTheCompilersRuntime) {
  const CpuInfo& cpu = this_cpu();
  EXPECT_TRUE(cpu.x86_64);
  EXPECT_FALSE(cpu.vendor.empty());
  EXPECT_EQ(cpu.missing_v3.empty(), __builtin_cpu_supports("x86-64-v3") != 0) << cpu.missing_v3;
  EXPECT_EQ(cpu.missing_v4.empty(), __builtin_cpu_supports("x86-64-v4") != 0) << cpu.missing_v4;
  EXPECT_EQ(unsupported_reason("x86-64", cpu), "");
}

TEST(CpuIsaTest, PreferenceTable) {
  // The widest variant the CPU runs ...
  EXPECT_EQ(preferred_variant(fake_cpu("GenuineIntel", true, true)), "avx512");
  EXPECT_EQ(preferred_variant(fake_cpu("GenuineIntel", true, false)), "avx2");
  EXPECT_EQ(preferred_variant(fake_cpu("GenuineIntel", false, false)), "x86-64");
  EXPECT_EQ(preferred_variant(fake_cpu("SomeOtherVendor", true, true)), "avx512");
  // ... on AMD as well (Zen 4 measured faster with the AVX-512 kernels than with AVX2).
  EXPECT_EQ(preferred_variant(fake_cpu("AuthenticAMD", true, true)), "avx512");
  EXPECT_EQ(preferred_variant(fake_cpu("AuthenticAMD", true, false)), "avx2");
  EXPECT_EQ(preferred_variant(fake_cpu("AuthenticAMD", false, false)), "x86-64");
  // A CPU that is not x86-64 at all still gets the first variant (nothing better to do).
  EXPECT_EQ(preferred_variant(CpuInfo{}), "x86-64");
}

TEST(CpuIsaTest, OptionBeatsEnvironmentBeatsAutomatic) {
  const CpuInfo intel = fake_cpu("GenuineIntel", true, true);
  VariantChoice c = choose_variant("", nullptr, intel, "cpu:0");
  EXPECT_STREQ(c.variant->name, "avx512");
  EXPECT_EQ(c.how, "automatic");
  c = choose_variant("", "avx2", intel, "cpu:0");
  EXPECT_STREQ(c.variant->name, "avx2");
  EXPECT_EQ(c.how, "RETRACE_CPU_ISA");
  c = choose_variant("x86-64", "avx2", intel, "cpu:0");
  EXPECT_STREQ(c.variant->name, "x86-64");
  EXPECT_EQ(c.how, "requested");
  c = choose_variant("auto", "baseline", intel, "cpu:0");  // "auto" defers to the environment
  EXPECT_STREQ(c.variant->name, "x86-64");
  c = choose_variant("", "auto", intel, "cpu:0");
  EXPECT_STREQ(c.variant->name, "avx512");
  c = choose_variant("", "", intel, "cpu:0");  // set but empty: automatic
  EXPECT_EQ(c.how, "automatic");
  EXPECT_STREQ(choose_variant("x86-64-v3", nullptr, intel, "cpu:0").variant->name, "avx2");
  EXPECT_STREQ(choose_variant("x86-64-v4", nullptr, intel, "cpu:0").variant->name, "avx512");
}

TEST(CpuIsaTest, UnknownAndUnrunnableVariantsAreErrorsNamingTheCause) {
  const CpuInfo old_cpu = fake_cpu("GenuineIntel", false, false);
  EXPECT_RETRACE_ERROR((void)choose_variant("sse9", nullptr, old_cpu, "cpu:3"), invalid_argument,
                       "cpu:3: kernel_isa: unknown kernel variant 'sse9'; this build has: "
                       "x86-64, avx2, avx512");
  EXPECT_RETRACE_ERROR((void)choose_variant("", "neon", old_cpu, "cpu:0"), invalid_argument,
                       "RETRACE_CPU_ISA: unknown kernel variant 'neon'");
  EXPECT_RETRACE_ERROR((void)choose_variant("avx2", nullptr, old_cpu, "cpu:0"), unimplemented,
                       "cpu:0: kernel_isa: the avx2 kernels cannot run on Test CPU: it lacks "
                       "avx2, fma");
  EXPECT_RETRACE_ERROR((void)choose_variant("", "avx512", fake_cpu("AuthenticAMD", true, false),
                                            "cpu:1"),
                       unimplemented, "RETRACE_CPU_ISA: the avx512 kernels cannot run");
  EXPECT_EQ(unsupported_reason("avx2", CpuInfo{}), "not an x86-64 CPU");
}
#endif

TEST(CpuIsaTest, DevicesRunTheVariantTheyWereGiven) {
  for (const CpuKernelIsa& isa : cpu_kernel_isas()) {
    SCOPED_TRACE(isa.name);
    CpuDeviceOptions options;
    options.kernel_isa = isa.name;
    if (!isa.unusable.empty()) {
      EXPECT_RETRACE_ERROR((void)open_cpu_device(options), unimplemented, isa.unusable);
      continue;
    }
    auto device = open_cpu_device(options);
    EXPECT_EQ(cpu_kernel_isa(*device), isa.name);
    EXPECT_NE(device->description().find(isa.name + " kernels (requested)"), std::string::npos)
        << device->description();
    // The device works: an op through its kernels.
    const Tensor x = testing::device_tensor(*device, {1.0f, 2.0f, 3.0f}, {3});
    EXPECT_EQ(ops::mul(x, 2.0).to_vector<float>(), (std::vector<float>{2.0f, 4.0f, 6.0f}));
  }
  // A device with default options runs what default_cpu_kernel_isa() says.
  if (testing::test_skip_reason().empty()) {
    auto device = open_cpu_device();
    const auto [name, how] = default_cpu_kernel_isa();
    EXPECT_EQ(cpu_kernel_isa(*device), name);
    EXPECT_NE(device->description().find(name + " kernels (" + how + ")"), std::string::npos);
  }
}

TEST(CpuIsaTest, DevicesOnDifferentVariantsLiveSideBySide) {
  std::vector<std::unique_ptr<Device>> devices;
  for (const CpuKernelIsa& isa : cpu_kernel_isas()) {
    if (!isa.unusable.empty()) continue;
    CpuDeviceOptions options;
    options.kernel_isa = isa.name;
    options.id = DeviceId{static_cast<std::uint32_t>(devices.size())};
    devices.push_back(open_cpu_device(options));
  }
  ASSERT_FALSE(devices.empty());
  for (auto& device : devices) {
    const Tensor x = testing::device_tensor(*device, testing::random_floats(1000, 3), {10, 100});
    const Tensor y = ops::softmax(x);
    device->synchronize();
    const std::vector<float> v = y.to_vector<float>();
    float row = 0.0f;
    for (int i = 0; i < 100; ++i) row += v[static_cast<std::size_t>(i)];
    EXPECT_NEAR(row, 1.0f, 1e-5f) << device->name();
  }
}

TEST(CpuIsaTest, BadEnvironmentFailsTheDeviceNotTheProcess) {
  const char* saved = std::getenv("RETRACE_CPU_ISA");
  const std::string restore = saved != nullptr ? saved : "";
  ::setenv("RETRACE_CPU_ISA", "definitely-not-an-isa", 1);
  EXPECT_RETRACE_ERROR((void)open_cpu_device(), invalid_argument,
                       "cpu:0: RETRACE_CPU_ISA: unknown kernel variant 'definitely-not-an-isa'");
  EXPECT_RETRACE_ERROR((void)default_cpu_kernel_isa(), invalid_argument, "unknown kernel variant");
  // An explicit option does not look at the environment.
  CpuDeviceOptions options;
  options.kernel_isa = cpu_kernel_isas().front().name;
  EXPECT_EQ(cpu_kernel_isa(*open_cpu_device(options)), options.kernel_isa);
  if (saved != nullptr) ::setenv("RETRACE_CPU_ISA", restore.c_str(), 1);
  else ::unsetenv("RETRACE_CPU_ISA");
}

}  // namespace
}  // namespace retrace::cpu
