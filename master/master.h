// Master: the control plane of one job.
//
// Tracks servers and workers (registration, heartbeats, leases), places
// parameter partitions on servers (the versioned cluster map), cuts the
// data into shards and hands them out epoch by epoch, counts every
// committed record once, runs the final evaluation over all of data.eval
// (AUC and log loss over every eval record), serves /status, /metrics and /
// over HTTP, and when the job ends writes DATA_DIR/final_status.json and
// tells every server and worker to exit. Holds no parameters.
//
// Thread-safety: safe for concurrent use. Start, Wait and RequestStop come
// from the owning thread (RequestStop may come from a signal-watching one).

#ifndef EPS_MASTER_MASTER_H_
#define EPS_MASTER_MASTER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "core/job_config.h"
#include "core/status.h"
#include "rpc/security.h"

namespace eps {

struct MasterOptions {
  // The job, as read from the config file and command line.
  JobConfig job;
  // RPC port; 0 picks a free one. Default 7070.
  int64_t port = 7070;
  // HTTP port of /status, /metrics and /; 0 picks a free one. Default 7071.
  int64_t http_port = 7071;
  // Where the master keeps its files (master.json with its endpoints,
  // final_status.json). Created if missing. Default "eps-master".
  std::string data_dir = "eps-master";
  // Continue a stopped job (or one whose servers are gone) from its last
  // complete checkpoint: every server slot is filled again (servers restarted
  // on their --data-dir take their own slots back, fresh ones free slots), every
  // server restores that checkpoint, and the data progress returns to it.
  // Default false.
  bool resume = false;
  // CURVE and the job's keys, from [security] (LoadSecurity); off when
  // default-made (in-process tests).
  SecurityOptions security;

  Status Validate() const;
};

class Master {
 public:
  explicit Master(const MasterOptions& options);
  ~Master();
  Master(const Master&) = delete;
  Master& operator=(const Master&) = delete;

  // Checks the data paths, binds the ports, writes DATA_DIR/master.json
  // ({"rpc": ..., "http": ...}) and starts serving; the data files are
  // scanned in the background. kInvalidArgument for bad options or a job
  // spec a server or worker would refuse (BuildJobSpec runs
  // ValidateJobSpec), kNotFound for missing data (naming the option and
  // path), kUnavailable when a port cannot be bound,
  // kPermissionDenied/kUnavailable when the data dir cannot be written.
  Status Start();

  // Blocks until the job is over and every peer has been told to exit (or
  // its lease ran out). OK when the job finished; the failure otherwise.
  Status Wait();

  // Ends the job early (SIGTERM): the job stops with `reason` (its state is
  // "failed", marked resumable: `--resume` continues it from its last
  // checkpoint), peers are told to exit; a data scan in progress stops. Safe
  // to call from any thread, more than once.
  void RequestStop(const std::string& reason);

  // Valid after Start.
  const std::string& rpc_endpoint() const;
  const std::string& http_url() const;

  // The /status document (JSON text).
  std::string StatusJson() const;

  // True when the job was stopped (RequestStop) rather than over: --resume
  // continues it.
  bool Resumable() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace eps

#endif  // EPS_MASTER_MASTER_H_
