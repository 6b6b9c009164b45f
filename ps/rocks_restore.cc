// RestoreRocksCheckpoint (ps/kv_store.h): a RocksDB checkpoint copied (SSTs
// hard-linked) beside the database dir, fsynced, then renamed into place.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "ps/kv_store.h"

namespace eps {
namespace {

namespace fs = std::filesystem;

// fsyncs a file or directory, so that a restored database survives a
// machine crash.
Status SyncPath(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot open ", path.string()));
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) return absl::UnavailableError(absl::StrCat("cannot fsync ", path.string()));
  return absl::OkStatus();
}

}  // namespace

Status RestoreRocksCheckpoint(const std::string& checkpoint, const std::string& dir) {
  std::error_code error;
  const fs::path source = fs::absolute(checkpoint, error);
  if (error) return absl::InvalidArgumentError(absl::StrCat("bad checkpoint path ", checkpoint));
  const fs::path target = fs::absolute(dir, error).lexically_normal();
  if (error || !target.has_filename()) {
    return absl::InvalidArgumentError(absl::StrCat("bad database path ", dir));
  }
  if (!fs::is_directory(source, error)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint ", checkpoint));
  }
  if (!fs::is_regular_file(source / "CURRENT", error)) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", checkpoint, " is not a RocksDB database (no CURRENT)"));
  }
  // Removing `dir` would delete a checkpoint kept inside it.
  const fs::path canonical_source = fs::weakly_canonical(source, error);
  const fs::path canonical_target = fs::weakly_canonical(target, error);
  if (error) return absl::UnavailableError(absl::StrCat("cannot resolve ", dir));
  const auto [target_end, unused] = std::mismatch(canonical_target.begin(), canonical_target.end(),
                                                  canonical_source.begin(), canonical_source.end());
  if (target_end == canonical_target.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", checkpoint, " lies inside the database dir ", dir));
  }

  // Build the copy beside `dir`, then swap it in: a crash midway never
  // leaves a half-copied database under `dir`.
  const fs::path staging = fs::path(target.string() + ".restore");
  fs::remove_all(staging, error);
  if (error || !fs::create_directories(staging, error) || error) {
    return absl::UnavailableError(absl::StrCat("cannot create ", staging.string()));
  }
  // Error-code overloads throughout: std::filesystem must not throw here.
  fs::directory_iterator it(source, error);
  for (; !error && it != fs::directory_iterator(); it.increment(error)) {
    const fs::directory_entry& entry = *it;
    std::error_code type_error;
    if (!entry.is_regular_file(type_error)) continue;
    const fs::path to = staging / entry.path().filename();
    // SSTs are immutable once written (RocksDB deletes them, never edits
    // them), so a hard link is safe and costs no space or time. Every other
    // file (CURRENT, MANIFEST, OPTIONS, WALs) is copied: the reopened
    // database may append to or truncate them, which through a link would
    // change the checkpoint.
    bool linked = false;
    if (entry.path().extension() == ".sst") {
      std::error_code link_error;
      fs::create_hard_link(entry.path(), to, link_error);
      linked = !link_error;  // else another file system: copy
    }
    if (!linked) {
      if (!fs::copy_file(entry.path(), to, error) || error) {
        return absl::UnavailableError(absl::StrCat("cannot copy ", entry.path().string(), " to ",
                                                   to.string(), ": ", error.message()));
      }
      RETURN_IF_ERROR(SyncPath(to));
    }
  }
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot list checkpoint ", checkpoint, ": ", error.message()));
  }
  RETURN_IF_ERROR(SyncPath(staging));
  fs::remove_all(target, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot remove ", dir, ": ", error.message()));
  }
  fs::rename(staging, target, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", staging.string(), " to ", dir, ": ", error.message()));
  }
  return SyncPath(target.parent_path());
}

}  // namespace eps
