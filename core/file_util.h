// File helpers shared by every role: writing a small file whole or not at all.
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
// then still holds its old contents, if it had any.
Status WriteFileAtomically(const std::string& path, std::string_view contents);

}  // namespace eps

#endif  // EPS_CORE_FILE_UTIL_H_
