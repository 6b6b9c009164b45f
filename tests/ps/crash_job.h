// The job of tests/ps/crash_test.cc and its child, ps_crash_child: one SGD
// table (id 0, dim 4, learning rate 1, zeros), so that pushing gradient -1
// adds 1 to every weight and weights count pushes exactly.
//
// Thread-safety: a pure function.

#ifndef EPS_TESTS_PS_CRASH_JOB_H_
#define EPS_TESTS_PS_CRASH_JOB_H_

#include "proto/eps.pb.h"

namespace eps {

inline proto::JobSpec CrashTestJob() {
  proto::JobSpec job;
  job.set_name("crash-test");
  job.set_seed(1);
  proto::TableSpec& spec = *job.add_tables();
  spec.set_id(0);
  spec.set_name("counts");
  spec.set_kind(proto::EMBEDDING);
  spec.set_dim(4);
  spec.mutable_initializer()->set_kind(proto::InitializerSpec::ZEROS);
  spec.mutable_optimizer()->set_kind(proto::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  return job;
}

}  // namespace eps

#endif  // EPS_TESTS_PS_CRASH_JOB_H_
