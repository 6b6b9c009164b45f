#include "core/data_paths.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace eps {
namespace {

bool IsRegularFile(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandDataPaths(const std::string& spec,
                                                   const std::string& option) {
  std::vector<std::string> files;
  for (absl::string_view raw : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    const std::string entry(absl::StripAsciiWhitespace(raw));
    std::error_code error;
    if (std::filesystem::is_directory(entry, error)) {
      const size_t before = files.size();
      // increment(error) rather than a range-for, whose ++ throws.
      std::filesystem::directory_iterator it(entry, error);
      for (; !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
        const std::string name = it->path().filename().string();
        if (name.empty() || name[0] == '.') continue;
        std::error_code type_error;
        if (it->is_regular_file(type_error)) files.push_back(it->path().string());
      }
      if (error) {
        return absl::UnavailableError(
            absl::StrCat(option, ": cannot list directory ", entry, ": ", error.message()));
      }
      if (files.size() == before) {
        return absl::NotFoundError(
            absl::StrCat(option, ": directory ", entry, " holds no data files"));
      }
      continue;
    }
    if (IsRegularFile(entry)) {
      files.push_back(entry);
      continue;
    }
    glob_t matches{};
    const int rc = ::glob(entry.c_str(), 0, nullptr, &matches);
    size_t found = 0;
    if (rc == 0) {
      for (size_t i = 0; i < matches.gl_pathc; ++i) {
        if (IsRegularFile(matches.gl_pathv[i])) {
          files.push_back(matches.gl_pathv[i]);
          ++found;
        }
      }
    }
    globfree(&matches);
    if (found == 0) {
      return absl::NotFoundError(
          absl::StrCat(option, ": no such file, directory or matching glob: ", entry));
    }
  }
  if (files.empty()) return absl::NotFoundError(absl::StrCat(option, ": names no files"));
  // Workers may run elsewhere: hand them absolute, normalised paths.
  for (std::string& file : files) {
    std::error_code error;
    std::filesystem::path absolute = std::filesystem::absolute(file, error);
    if (!error) file = absolute.lexically_normal().string();
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

}  // namespace eps
