// DataSet: a job's data files cut into shards of whole records.
//
// data.train and data.eval name files, globs or directories
// (comma-separated). The master scans every file once, counting lines, and
// cuts a shard every `shard_records` lines: a shard is a byte range aligned
// to record starts, with the line number of its first record, so a worker
// can report a malformed line as FILE:LINE.
//
// Thread-safety: DataSet is an immutable value after CutIntoShards.

#ifndef EPS_MASTER_DATA_SET_H_
#define EPS_MASTER_DATA_SET_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace eps {

struct ShardSpec {
  uint32_t file = 0;
  uint64_t begin = 0;  // byte offset of the first record
  uint64_t end = 0;    // one past the last byte (after its '\n')
  uint64_t first_line = 1;
  uint64_t records = 0;
};

struct DataSet {
  std::vector<std::string> files;
  std::vector<ShardSpec> shards;
  uint64_t records = 0;
  uint64_t bytes = 0;
};

// Expands a comma-separated list of files, globs and directories (a
// directory means the regular files directly in it, hidden files skipped)
// into a sorted, de-duplicated list of absolute paths. kNotFound names the first entry
// that matches no file; `option` (e.g. "data.train") prefixes messages.
StatusOr<std::vector<std::string>> ExpandDataPaths(const std::string& spec,
                                                   const std::string& option);

// Called during a scan (after every read of a few MiB) with (bytes scanned,
// total bytes). Returning false stops the scan.
using ScanProgress = std::function<bool(uint64_t, uint64_t)>;

// Scans `files` and cuts them into shards of `shard_records` lines (the
// last shard of each file may be shorter; empty files give none). Blocks
// for the scan. kUnavailable/kNotFound on read errors, naming the file;
// kCancelled when `progress` returned false.
StatusOr<DataSet> CutIntoShards(std::vector<std::string> files, uint64_t shard_records,
                                const ScanProgress& progress = nullptr);

}  // namespace eps

#endif  // EPS_MASTER_DATA_SET_H_
