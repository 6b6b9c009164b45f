// The data files a job option names: files, globs and directories.
//
// Thread-safety: a pure function of the file system; safe for concurrent use.

#ifndef EPS_CORE_DATA_PATHS_H_
#define EPS_CORE_DATA_PATHS_H_

#include <string>
#include <vector>

#include "core/status.h"

namespace eps {

// Expands a comma-separated list of files, globs and directories (a
// directory means the regular files directly in it, hidden files skipped)
// into a sorted, de-duplicated list of absolute paths. kNotFound names the first entry
// that matches no file; `option` (e.g. "data.train") prefixes messages.
StatusOr<std::vector<std::string>> ExpandDataPaths(const std::string& spec,
                                                   const std::string& option);

}  // namespace eps

#endif  // EPS_CORE_DATA_PATHS_H_
