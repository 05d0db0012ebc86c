// retrace: the command line. `retrace demo` runs the traced denoising loop of the example DiT
// (what `make demo` runs); `retrace decode` turns latents into an image with the Stable
// Diffusion VAE; `retrace inspect` captures one step and prints its trace; `retrace bench`
// compares eager, traced and the kernel-library floor.
//
// Exit status: 0 success; 1 a check failed (traced != eager, a peer disagreed); 2 a usage
// error or an error raised while running (one line on stderr, "retrace: ..."); 3 the device
// asked for cannot be used on this machine.
#include "demo_common.hpp"
#include "dit_bench.hpp"
#include "model_options.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

namespace retrace::cli {
int run_demo(ModelOptions& options, const DemoOptions& demo);
int run_inspect(ModelOptions& options, const InspectOptions& inspect);
int run_decode(ModelOptions& options, const DecodeOptions& decode);
}  // namespace retrace::cli

namespace {

constexpr int kUsageError = 2;

int fail(const std::string& message, int status = kUsageError) {
  std::fprintf(stderr, "retrace: %s\n", message.c_str());
  return status;
}

// retrace --version: the version, what this build has, and where the docs are.
std::string version_text() {
  std::string text = fmt::format("retrace {}\n", retrace::version());
  for (const retrace::BackendStatus& backend : retrace::available_backends()) {
    text += fmt::format("  backend {}: {}\n", backend.name,
                        backend.available ? "available" : "unavailable (" + backend.reason + ")");
  }
  std::vector<std::string> variants;
  for (const retrace::CpuKernelIsa& isa : retrace::cpu_kernel_isas()) {
    variants.push_back(isa.unusable.empty() ? isa.name : isa.name + " (not on this CPU)");
  }
  text += fmt::format("  CPU kernel variants: {}\n", fmt::join(variants, ", "));
#ifdef RETRACE_HAVE_MPI
  text += "  meshes across processes: MPI\n";
#else
  text += "  meshes across processes: not built (no MPI library was found)\n";
#endif
  text += fmt::format("  documentation: {}", retrace::cli::docs_page("README.md"));
  return text;
}

// An unknown first word is named (CLI11 alone would only say a subcommand is required).
std::string unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return {};
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (sub->get_name() == argv[1]) return {};
  }
  return argv[1];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    CLI::App app{"retrace: capture device work once, replay it safely"};
    app.require_subcommand(1);
    app.set_version_flag("--version", version_text, "print the version and what this build has");
    retrace::cli::ModelOptions demo_options, inspect_options;
    inspect_options.config.depth = 2;
    retrace::cli::InspectOptions inspect_extra;
    CLI::App* demo = app.add_subcommand(
        "demo", "class-conditional sampling with a diffusion transformer (DiT), eager and traced, "
        "compared");
    retrace::cli::add_model_options(*demo, demo_options);
    retrace::cli::DemoOptions demo_extra;
    demo->add_option("--class", demo_extra.label,
                     "class label to sample (default 207, or 0 with fewer classes)")
        ->check(retrace::cli::whole_number(0, INT64_MAX));
    demo->add_option("--cfg-scale", demo_extra.cfg_scale,
                     "classifier-free guidance scale (1: none)")
        ->check(CLI::Range(0.0, 1000.0));
    demo->add_option("--sampler", demo_extra.sampler,
                     "ddim (deterministic), euler, or euler-ancestral (draws fresh noise every "
                     "step, on the device, also in the trace)")
        ->check(CLI::IsMember({"ddim", "euler", "euler-ancestral"}));
    demo->add_option("--mesh", demo_extra.mesh,
                     "also run the model split over a mesh of N CPU devices, or N GPUs with "
                     "--device cuda (tensor parallel: heads and MLP width; N must divide both), "
                     "traced and eager, against one device")
        ->check(retrace::cli::whole_number(1, 64));
    demo->add_option(
        "--preview", demo_extra.preview,
        "write the final latents as a PNG here (default with --weights and no --vae: "
        "dit_sample.png)");
    CLI::Option* vae = demo->add_option(
        "--vae", demo_extra.vae,
        "decode the final latents with this VAE (diffusers' AutoencoderKL .safetensors, e.g. "
        "stabilityai/sd-vae-ft-ema), traced, and write the image");
    demo->add_option("--out", demo_extra.out, "with --vae: the image's PNG (default dit_sample.png)")
        ->needs(vae);
    CLI::Option* noise = demo->add_option(
        "--noise", demo_extra.noise,
        "start from these latents (.npy, float32 [B, C, H, W]; scaled by the sampler's initial "
        "sigma) instead of random ones, at their size only");
    CLI::Option* save = demo->add_option(
        "--save-latents", demo_extra.save_latents,
        "write the final latents (traced run) as .npy, float32 [B, C, H, W]");
    CLI::Option* mesh = demo->get_option("--mesh");
    vae->excludes(mesh);
    noise->excludes(mesh);
    save->excludes(mesh);
    CLI::App* inspect =
        app.add_subcommand("inspect", "capture one denoising step, print its trace");
    retrace::cli::add_model_options(*inspect, inspect_options);
    inspect->add_option("--dot", inspect_extra.dot_path,
                        "write a Graphviz graph of the trace to this file");
    inspect->add_flag("--profile", inspect_extra.profile,
                      "replay the trace with every command timed; print time by op and the "
                      "slowest commands");
    inspect->add_option("--replays", inspect_extra.replays,
                        "timed replays of --profile (medians are reported)")
        ->check(retrace::cli::whole_number(1, 100000));
    inspect->add_option("--vae", inspect_extra.vae,
                        "inspect one decode of this VAE (diffusers' AutoencoderKL .safetensors) "
                        "of a [1, C, --input-size, --input-size] latent instead of a DiT step")
        ->check(CLI::ExistingFile);
    inspect->add_option("--trace-json", inspect_extra.trace_json,
                        "with --profile: write a Chrome/Perfetto trace of one replay (open it in "
                        "ui.perfetto.dev or chrome://tracing)");
    retrace::cli::ModelOptions decode_model;
    retrace::cli::DecodeOptions decode_options;
    CLI::App* decode = app.add_subcommand(
        "decode", "latents (.npy) to an image with the Stable Diffusion VAE decoder, eager and "
                  "traced, compared");
    decode_model.app = decode;
    decode->add_option("--vae", decode_options.vae,
                       "the VAE: diffusers' AutoencoderKL .safetensors (e.g. "
                       "stabilityai/sd-vae-ft-ema's diffusion_pytorch_model.safetensors)")
        ->required()
        ->check(CLI::ExistingFile);
    decode->add_option("--latents", decode_options.latents,
                       "the latents: .npy, [B, C, h, w], as the sampler leaves them (divided by "
                       "--scaling-factor before decoding)")
        ->required()
        ->check(CLI::ExistingFile);
    decode->add_option("--out", decode_options.out,
                       "the image's PNG (with B > 1: NAME_i.png for each), default decoded.png");
    decode->add_option("--save-image", decode_options.save_image,
                       "also write the decoder's output as .npy, float32 [B, 3, H, W]");
    decode->add_option("--replays", decode_options.replays, "timed replays of the trace")
        ->check(retrace::cli::whole_number(1, 100000));
    decode->add_option("--norm-groups", decode_options.norm_groups,
                       "groups of the VAE's group norms (not stored in the file; 32 in every "
                       "published Stable Diffusion VAE)")
        ->check(retrace::cli::whole_number(1, 1 << 20));
    decode->add_option("--scaling-factor", decode_options.scaling_factor,
                       "the latents are divided by this first (0.18215: Stable Diffusion 1.x/2.x, "
                       "DiT)")
        ->check(CLI::Range(1e-30, 1e30));
    decode->add_option("--dtype", decode_model.dtype, "float32, bfloat16 or float16")
        ->check(CLI::IsMember({"float32", "bfloat16", "float16"}));
    decode->add_option("--device", decode_model.device,
                       "the device: a backend, optionally with a number (cpu, cuda, cuda:1)");
    decode->add_option("--memory", decode_model.memory,
                       "device memory, e.g. 8G (default: the device's, raised to fit the decode)")
        ->check(retrace::cli::byte_size());
    decode->add_flag("--allow-unused-weights", decode_model.allow_unused,
                     "warn about tensors of --vae the decoder does not use instead of failing");
    retrace::bench::BenchOptions bench_options;
    int libtorch_peer = 0;
    std::string export_steps;
    CLI::App* bench = app.add_subcommand(
        "bench",
        "one denoising step: eager vs traced vs the kernel-library floor, 1 and 2 threads");
    bench->add_option("--json", bench_options.json_path, "write the results as JSON");
    bench->add_option("--plot", bench_options.plot_path, "write a PNG chart (needs gnuplot)");
    bench->add_option("--sizes", bench_options.sizes,
                      "DiT sizes to run: S, M, L, or none (only the --decode row)")
        ->delimiter(',')
        ->check(CLI::IsMember({"S", "M", "L", "none"}));
    bench->add_option("--dtypes", bench_options.dtypes,
                      "the step's dtypes: float32, bfloat16 or both (default)")
        ->delimiter(',')
        ->check(CLI::IsMember({"float32", "bfloat16"}));
    bench->add_option("--isa", bench_options.isas,
                      "CPU kernel variants to measure: names (x86-64, avx2, avx512) or all; "
                      "default: the one a device picks")
        ->delimiter(',');
    // Internal: the bench's libtorch child process (one size, this many threads).
    bench->add_option("--libtorch-peer", libtorch_peer)
        ->check(retrace::cli::whole_number(1, 1024))
        ->group("");
    bench->add_option("--export-steps", export_steps,
                      "write each size's weights, step inputs and retrace's result to "
                      "DIR/dit_step_<size>.safetensors (for bench/python/peers.py) and stop");
    bench->add_option("--repeats", bench_options.repeats, "rounds per mode")
        ->check(retrace::cli::whole_number(1, 10000));
    bench->add_option("--steps", bench_options.steps, "steps per round")
        ->check(retrace::cli::whole_number(1, 10000));
    bench->add_option("--decode", bench_options.decode_sizes,
                      "also time the VAE decode to images of these sizes (e.g. 256,512; "
                      "multiples of 8), eager and traced, 1 and 2 threads")
        ->delimiter(',')
        ->check(retrace::cli::whole_number(8, 8192));
    bench->add_option("--decode-repeats", bench_options.decode_repeats,
                      "timed decodes per mode (default 3)")
        ->check(retrace::cli::whole_number(1, 1000));
    std::string bench_conv2d = "winograd";
    bench->add_option("--conv2d", bench_conv2d,
                      "float32 3x3 convolutions: winograd (default, on the CPU device) or im2col "
                      "(ops::set_conv2d_winograd(false))")
        ->check(CLI::IsMember({"winograd", "im2col"}));
    bench->add_option("--vae", bench_options.vae,
                      "the decode row's VAE: diffusers' AutoencoderKL .safetensors (default: the "
                      "Stable Diffusion VAE's architecture with random weights)")
        ->check(CLI::ExistingFile);
    bench->add_option("--load", bench_options.load,
                      "also measure every cell with N busy processes spinning on this process' "
                      "CPUs (started and stopped by the bench), and report loaded / unloaded")
        ->check(retrace::cli::whole_number(0, 1024));

    if (const std::string unknown = unknown_command(app, argc, argv); !unknown.empty()) {
      return fail(fmt::format("unknown command '{}' (commands: demo, decode, inspect, bench; see "
                              "retrace --help)",
                              unknown));
    }
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
      return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
      return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
      return app.exit(e);
    } catch (const CLI::ParseError& e) {
      return fail(fmt::format("{} (see retrace --help)", e.what()));
    }
    if (*demo) return retrace::cli::run_demo(demo_options, demo_extra);
    if (*decode) return retrace::cli::run_decode(decode_model, decode_options);
    if (*bench) {
      retrace::ops::set_conv2d_winograd(bench_conv2d == "winograd");
      auto& sizes = bench_options.sizes;
      sizes.erase(std::remove(sizes.begin(), sizes.end(), "none"), sizes.end());
      for (std::int64_t image : bench_options.decode_sizes) {
        if (image % 8 != 0) {
          return fail(fmt::format("--decode {}: an image size is a multiple of 8 (the VAE "
                                  "upsamples latents 8x)",
                                  image));
        }
      }
    }
    if (*bench && libtorch_peer > 0) {
      return retrace::bench::run_libtorch_peer(bench_options.sizes.at(0), libtorch_peer,
                                               bench_options.repeats, bench_options.steps);
    }
    if (*bench && !export_steps.empty()) {
      return retrace::bench::export_dit_steps(export_steps, bench_options.sizes,
                                              bench_options.steps);
    }
    if (*bench) return retrace::bench::run_dit_bench(bench_options);
    return retrace::cli::run_inspect(inspect_options, inspect_extra);
  } catch (const retrace::cli::DeviceUnavailable& e) {
    return fail(e.what(), 3);
  } catch (const retrace::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of host memory (an allocation failed); try a smaller --input-size or --hidden, "
                "or raise the memory limit");
  } catch (const std::length_error& e) {
    return fail(fmt::format("out of host memory: a container would exceed its maximum size ({})",
                            e.what()));
  } catch (const std::exception& e) {
    return fail(fmt::format("unexpected error: {}", e.what()));
  } catch (...) {
    return fail("unexpected error of an unknown type");
  }
}
