// The job's stored record: which options a restarted master must share with
// the saved job (the config fingerprint), and whether a saved record may be
// taken up at all. The record's fields themselves are written and read by
// the unit that owns each (SaveTo/RestoreFrom); JobControl::SaveRecord
// composes them.
//
// Thread-safety: functions of their arguments; safe for concurrent use.

#ifndef EPS_MASTER_JOB_RECORD_H_
#define EPS_MASTER_JOB_RECORD_H_

#include <string>
#include <vector>

#include "core/job_config.h"
#include "core/status.h"
#include "proto/eps.pb.h"

namespace eps {

// The layout of MasterRecord this version writes and reads.
inline constexpr uint32_t kMasterRecordFormat = 1;

// Options that must not change while a job's state lives in --data-dir, as
// "key=value" lines.
std::string JobFingerprint(const JobConfig& config, const std::vector<std::string>& train,
                           const std::vector<std::string>& eval);

// Whether the saved `record` may be taken up by a master with `fingerprint`
// (`resume`: eps-master --resume). kFailedPrecondition naming the options
// that differ, a newer format, a job that is over, or a stopped job without
// --resume, each saying what to do.
Status CheckSavedJob(const proto::MasterRecord& record, const std::string& fingerprint,
                     const std::string& data_dir, bool resume);

}  // namespace eps

#endif  // EPS_MASTER_JOB_RECORD_H_
