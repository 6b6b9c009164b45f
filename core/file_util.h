// File helpers shared by every role: writing a small file whole or not at
// all, reading one whole.
//
// Thread-safety: safe for concurrent use on different paths; concurrent
// writes of the same path race on its temporary file.

#ifndef EPS_CORE_FILE_UTIL_H_
#define EPS_CORE_FILE_UTIL_H_

#include <string>
#include <string_view>

#include "core/status.h"

namespace eps {

// Writes `contents` to `path` whole or not at all: into `path`.tmp, fsynced,
// renamed over `path`, then the directory fsynced, so that after an OK
// return the new contents survive a machine crash and a reader never sees a
// partial file. Blocks on the disk. kUnavailable naming the file when any
// step fails (the directory does not exist, the disk is full, ...); `path`
// then still holds its old contents, if it had any. A new file gets the
// permission bits `mode` (less the umask); 0600 for secrets.
Status WriteFileAtomically(const std::string& path, std::string_view contents,
                           int mode = 0644);

// The whole of a small file (a key, a token). kNotFound naming the file when
// it does not exist, kPermissionDenied when it cannot be read,
// kInvalidArgument when it is larger than `max_bytes`, kUnavailable for
// other read errors.
StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes);

}  // namespace eps

#endif  // EPS_CORE_FILE_UTIL_H_
