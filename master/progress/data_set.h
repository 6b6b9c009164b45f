// DataSet: a job's data files cut into shards of whole lines.
//
// data.train and data.eval name files, globs or directories
// (comma-separated). The master scans every file once, counting lines, and
// cuts a shard every `shard_lines` lines (data.shard_records): a shard is a
// byte range aligned to line starts, with the line number of its first
// line, so a worker can report a malformed line as FILE:LINE. Sizes count
// lines, well-formed or not; the stored records (DataSetRecord,
// ShardRecord) call them `records`.
//
// Thread-safety: DataSet is an immutable value after CutIntoShards.

#ifndef EPS_MASTER_PROGRESS_DATA_SET_H_
#define EPS_MASTER_PROGRESS_DATA_SET_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/data_paths.h"
#include "core/status.h"
#include "proto/eps.pb.h"

namespace eps {

struct ShardSpec {
  uint32_t file = 0;
  uint64_t begin = 0;  // byte offset of the first line
  uint64_t end = 0;    // one past the last byte (after its '\n')
  uint64_t first_line = 1;
  uint64_t lines = 0;  // stored as ShardRecord.records
};

struct DataSet {
  std::vector<std::string> files;
  std::vector<ShardSpec> shards;
  uint64_t lines = 0;  // stored as DataSetRecord.records
  uint64_t bytes = 0;
};

// Called during a scan (after every read of a few MiB) with (bytes scanned,
// total bytes). Returning false stops the scan.
using ScanProgress = std::function<bool(uint64_t, uint64_t)>;

// Scans `files` and cuts them into shards of `shard_lines` lines (the
// last shard of each file may be shorter; empty files give none). Blocks
// for the scan. kUnavailable/kNotFound on read errors, naming the file;
// kCancelled when `progress` returned false.
StatusOr<DataSet> CutIntoShards(std::vector<std::string> files, uint64_t shard_lines,
                                const ScanProgress& progress = nullptr);

// Reads [begin, end) of `path` as CutIntoShards did and checks it still
// holds `lines` lines there: OK when it does. Otherwise why it does not,
// in words for the job's failure line: kNotFound (the file is gone),
// kPermissionDenied (it cannot be opened), kDataLoss (shorter than `end`:
// truncated; or another number of lines: changed), kUnavailable (a read
// error). Blocks for the read (one shard, a few MiB).
Status CheckShardRange(const std::string& path, uint64_t begin, uint64_t end, uint64_t lines);

// The data set as stored under data/train and data/eval (DataSetRecord,
// whose `records` fields hold the lines), and back. Pure conversions: no
// checks (a record that does not add up fails in ShardTracker::FromRecords).
proto::DataSetRecord DataSetToRecord(const DataSet& data);
DataSet DataSetFromRecord(const proto::DataSetRecord& record);

}  // namespace eps

#endif  // EPS_MASTER_PROGRESS_DATA_SET_H_
