// Runs an AOTInductor package (.pt2) on one image tensor, without Python.
//
//   aoti_runner MODEL.pt2 --shape B C H W [--input X.bin]
//       [--ops-library LIB.so]... [--threads N] [--iters N]
//       [--output-prefix PREFIX]
//
// The input is read from X.bin (float32, C order, of the given shape), or
// is seeded random normal. --ops-library loads a library that registers the
// operators the package calls (mmevo's, with TORCH_LIBRARY) before the
// package is loaded. Prints each output's shape, sum and first values;
// --output-prefix writes output i to PREFIX<i>.bin (float32, C order);
// --iters times that many runs and prints the median milliseconds.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

namespace {

struct Options {
  std::string model;
  std::string input;
  std::string output_prefix;
  std::vector<std::string> libraries;
  std::vector<int64_t> shape;
  int threads = 0;
  int iters = 0;
};

[[noreturn]] void fail(const std::string& message, int status = 1) {
  std::cerr << "error: " << message << std::endl;
  std::exit(status);
}

Options parse(int argc, char** argv) {
  Options opts;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) {
      fail(std::string(argv[i]) + " needs a value", 2);
    }
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--input") {
      opts.input = value(i);
    } else if (arg == "--output-prefix") {
      opts.output_prefix = value(i);
    } else if (arg == "--ops-library") {
      opts.libraries.push_back(value(i));
    } else if (arg == "--threads") {
      opts.threads = std::stoi(value(i));
    } else if (arg == "--iters") {
      opts.iters = std::stoi(value(i));
    } else if (arg == "--shape") {
      for (int k = 0; k < 4; ++k) {
        opts.shape.push_back(std::stoll(value(i)));
      }
    } else if (opts.model.empty() && arg.rfind("--", 0) != 0) {
      opts.model = arg;
    } else {
      fail("unknown argument " + arg, 2);
    }
  }
  if (opts.model.empty() || opts.shape.size() != 4) {
    fail("usage: aoti_runner MODEL.pt2 --shape B C H W [--input X.bin] "
         "[--ops-library LIB.so]... [--threads N] [--iters N] "
         "[--output-prefix PREFIX]",
         2);
  }
  return opts;
}

torch::Tensor read_input(const Options& opts) {
  if (opts.input.empty()) {
    torch::manual_seed(0);
    return torch::randn(opts.shape);
  }
  auto x = torch::empty(opts.shape);
  std::ifstream file(opts.input, std::ios::binary);
  const auto bytes = static_cast<std::streamsize>(x.nbytes());
  file.read(static_cast<char*>(x.data_ptr()), bytes);
  if (file.gcount() != bytes || file.peek() != EOF) {
    fail("input " + opts.input + " must hold " + std::to_string(bytes) +
         " bytes (float32 of the --shape)");
  }
  return x;
}

void write(const torch::Tensor& t, const std::string& path) {
  auto out = t.to(torch::kFloat32).contiguous();
  std::ofstream file(path, std::ios::binary);
  file.write(static_cast<const char*>(out.data_ptr()),
             static_cast<std::streamsize>(out.nbytes()));
}

}  // namespace

int run(const Options& opts);

int main(int argc, char** argv) {
  const Options opts = parse(argc, argv);
  try {
    return run(opts);
  } catch (const c10::Error& e) {
    // the message without libtorch's backtrace (e.g. an operator the
    // package calls that no loaded library registers)
    fail(e.what_without_backtrace());
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

int run(const Options& opts) {
  // RTLD_GLOBAL: the registrations of the library's TORCH_LIBRARY blocks
  // run on load and must be visible to the package's calls.
  for (const auto& lib : opts.libraries) {
    if (dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      fail("cannot load " + lib + ": " + dlerror());
    }
  }
  if (opts.threads > 0) {
    torch::set_num_threads(opts.threads);
  }
  c10::InferenceMode inference;
  // the input first: a wrong file is reported before the package loads
  const std::vector<torch::Tensor> inputs{read_input(opts)};
  torch::inductor::AOTIModelPackageLoader loader(opts.model);
  auto outputs = loader.run(inputs);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& out = outputs[i];
    auto flat = out.flatten().to(torch::kFloat64);
    std::cout << "output " << i << ": shape " << out.sizes() << " sum "
              << flat.sum().item<double>() << " first";
    for (int64_t k = 0; k < std::min<int64_t>(4, flat.numel()); ++k) {
      std::cout << " " << flat[k].item<double>();
    }
    std::cout << std::endl;
    if (!opts.output_prefix.empty()) {
      write(out, opts.output_prefix + std::to_string(i) + ".bin");
    }
  }
  if (opts.iters > 0) {
    std::vector<double> ms;
    for (int it = 0; it < opts.iters; ++it) {
      const auto start = std::chrono::steady_clock::now();
      loader.run(inputs);
      const auto stop = std::chrono::steady_clock::now();
      ms.push_back(
          std::chrono::duration<double, std::milli>(stop - start).count());
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    std::cout << "median " << ms[ms.size() / 2] << " ms over " << opts.iters
              << " runs, " << torch::get_num_threads() << " threads"
              << std::endl;
  }
  return 0;
}
