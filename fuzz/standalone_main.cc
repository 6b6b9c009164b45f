// A stand-in for libFuzzer's driver, linked into every fuzz target in
// builds without EPS_FUZZ (gcc, the default): it runs every seed file, then
// random mutations of them for a bounded time, so that the default test
// suite exercises each target briefly. No coverage feedback: the EPS_FUZZ
// build (clang, libFuzzer) does the real search.
//
//   NAME_fuzzer [--seconds=S] [--runs=N] [--seed=N] SEED_FILE_OR_DIR...
//
// Defaults: 3 seconds, no limit on runs, seed 1 (runs are reproducible for a
// given seed when bounded by --runs). A crash writes the input that caused
// it to ./crash-NAME_fuzzer (replay it by passing that file alone).
//
// Thread-safety: one thread only.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

constexpr size_t kMaxInput = 1 << 16;

// The input being run, for the crash handler (async-signal-safe access only).
const std::string* g_current = nullptr;
char g_crash_path[512] = "crash";

void OnCrash(int signal) {
  if (g_current != nullptr) {
    const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ssize_t ignored = ::write(fd, g_current->data(), g_current->size());
      (void)ignored;
      ::close(fd);
    }
    constexpr char kMessage[] = "standalone fuzz driver: crashed; the input is in ";
    ssize_t ignored = ::write(2, kMessage, sizeof(kMessage) - 1);
    ignored = ::write(2, g_crash_path, std::strlen(g_crash_path));
    ignored = ::write(2, "\n", 1);
    (void)ignored;
  }
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

void Run(const std::string& input) {
  g_current = &input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  g_current = nullptr;
}

// One to four random edits of `input`, some splicing in bytes of `other`.
void Mutate(std::mt19937_64& random, const std::string& other, std::string* input) {
  const auto below = [&random](size_t n) { return n == 0 ? 0 : random() % n; };
  static constexpr uint8_t kInteresting[] = {0, 1, 0x7f, 0x80, 0xff, '\t', '\n', ',', '=', '#'};
  const int edits = 1 + static_cast<int>(below(4));
  for (int e = 0; e < edits; ++e) {
    std::string& s = *input;
    switch (below(7)) {
      case 0:  // flip a bit
        if (!s.empty()) s[below(s.size())] ^= static_cast<char>(1 << below(8));
        break;
      case 1:  // an interesting byte
        if (!s.empty()) s[below(s.size())] = static_cast<char>(kInteresting[below(10)]);
        break;
      case 2:  // insert random bytes
        s.insert(below(s.size() + 1), std::string(1 + below(8), static_cast<char>(random())));
        break;
      case 3:  // erase a range
        if (!s.empty()) {
          const size_t at = below(s.size());
          s.erase(at, 1 + below(std::min<size_t>(16, s.size() - at)));
        }
        break;
      case 4:  // duplicate a range
        if (!s.empty()) {
          const size_t at = below(s.size());
          const std::string piece = s.substr(at, 1 + below(32));
          s.insert(below(s.size() + 1), piece);
        }
        break;
      case 5:  // splice in part of another input
        if (!other.empty()) {
          const size_t at = below(other.size());
          s.insert(below(s.size() + 1), other.substr(at, 1 + below(64)));
        }
        break;
      default:  // overwrite a little-endian integer
        if (s.size() >= 4) {
          const uint32_t value = below(3) == 0 ? static_cast<uint32_t>(random())
                                               : static_cast<uint32_t>(below(300));
          std::memcpy(&s[below(s.size() - 3)], &value, 4);
        }
        break;
    }
  }
  if (input->size() > kMaxInput) input->resize(kMaxInput);
}

bool ReadFile(const std::filesystem::path& path, std::string* out) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return false;
  out->assign(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  uint64_t max_runs = 0;
  uint64_t seed = 1;
  std::vector<std::filesystem::path> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.rfind("--seconds=", 0) == 0) {
      seconds = std::atof(argv[i] + 10);
    } else if (arg.rfind("--runs=", 0) == 0) {
      max_runs = std::strtoull(argv[i] + 7, nullptr, 10);
    } else if (arg.rfind("--seed=", 0) == 0) {
      seed = std::strtoull(argv[i] + 7, nullptr, 10);
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "usage: %s [--seconds=S] [--runs=N] [--seed=N] SEED_FILE_OR_DIR...\n",
                   argv[0]);
      return 2;
    } else {
      paths.emplace_back(arg);
    }
  }
  LLVMFuzzerInitialize(&argc, &argv);
  const std::string name = std::filesystem::path(argv[0]).filename().string();
  std::snprintf(g_crash_path, sizeof(g_crash_path), "crash-%s", name.c_str());
  for (int signal : {SIGSEGV, SIGABRT, SIGFPE, SIGBUS, SIGILL}) ::signal(signal, OnCrash);

  std::vector<std::string> seeds;
  for (const std::filesystem::path& path : paths) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(path);
    }
    for (const std::filesystem::path& file : files) {
      std::string input;
      if (!ReadFile(file, &input)) {
        std::fprintf(stderr, "%s: cannot read %s\n", name.c_str(), file.c_str());
        return 2;
      }
      seeds.push_back(std::move(input));
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "%s: no seed inputs\n", name.c_str());
    return 2;
  }
  for (const std::string& input : seeds) Run(input);

  std::mt19937_64 random(seed);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  uint64_t runs = 0;
  std::string input;
  while ((max_runs == 0 || runs < max_runs) &&
         (max_runs != 0 || std::chrono::steady_clock::now() < deadline)) {
    // Mostly fresh mutations of a seed, sometimes a further one of the last.
    if (runs % 4 == 0 || input.empty()) input = seeds[random() % seeds.size()];
    Mutate(random, seeds[random() % seeds.size()], &input);
    Run(input);
    ++runs;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %zu seeds and %llu mutations in %.1f s, no crash\n", name.c_str(), seeds.size(),
              static_cast<unsigned long long>(runs), elapsed);
  return 0;
}
