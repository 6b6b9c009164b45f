#include "core/cpu_budget.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace eps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

CpuLimits Limits(int affinity, const std::string& cpu_max = "", int hardware = 0) {
  CpuLimits limits;
  limits.affinity_cpus = affinity;
  limits.hardware_threads = hardware;
  if (!cpu_max.empty()) {
    limits.quotas.push_back({"cpu.max", "/sys/fs/cgroup/job/cpu.max", cpu_max});
  }
  return limits;
}

TEST(ChooseCpuThreads, MaxIsNoLimit) {
  const CpuBudget budget = ChooseCpuThreads(Limits(4, "max 100000"), 0, 1);
  EXPECT_EQ(budget.threads, 4);
  EXPECT_EQ(budget.reason, "4 threads: affinity allows 4 CPUs, no cgroup CPU quota");
}

TEST(ChooseCpuThreads, OneCpuOfQuotaIsOneThread) {
  const CpuBudget budget = ChooseCpuThreads(Limits(2, "100000 100000"), 0, 1);
  EXPECT_EQ(budget.threads, 1);
  EXPECT_EQ(budget.reason,
            "1 thread: affinity allows 2 CPUs, cgroup cpu.max 100000/100000 = 1 -> 1");
}

TEST(ChooseCpuThreads, FractionalQuotaRoundsDown) {
  EXPECT_EQ(ChooseCpuThreads(Limits(2, "150000 100000"), 0, 1).threads, 1);
  EXPECT_EQ(ChooseCpuThreads(Limits(4, "250000 100000"), 0, 1).threads, 2);
  EXPECT_THAT(ChooseCpuThreads(Limits(4, "250000 100000"), 0, 1).reason,
              HasSubstr("cgroup cpu.max 250000/100000 = 2.5 -> 2"));
}

TEST(ChooseCpuThreads, QuotaBelowOneCpuIsStillOneThread) {
  EXPECT_EQ(ChooseCpuThreads(Limits(8, "50000 100000"), 0, 1).threads, 1);
}

TEST(ChooseCpuThreads, AffinityCapsAGenerousQuota) {
  const CpuBudget budget = ChooseCpuThreads(Limits(1, "400000 100000", /*hardware=*/2), 0, 1);
  EXPECT_EQ(budget.threads, 1);
  EXPECT_THAT(budget.reason, HasSubstr("affinity allows 1 of 2 CPUs"));
}

TEST(ChooseCpuThreads, TheTightestQuotaOfTheCgroupAndItsAncestorsWins) {
  CpuLimits limits = Limits(8, "max 100000");
  limits.quotas.push_back({"cpu.max", "/sys/fs/cgroup/cpu.max", "300000 100000"});
  limits.quotas.push_back({"cpu.max", "/sys/fs/cgroup/outer/cpu.max", "600000 100000"});
  EXPECT_EQ(ChooseCpuThreads(limits, 0, 1).threads, 3);
}

TEST(ChooseCpuThreads, CgroupV1QuotaCounts) {
  CpuLimits limits = Limits(4);
  limits.quotas.push_back({"cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
                           "200000 100000"});
  EXPECT_EQ(ChooseCpuThreads(limits, 0, 1).threads, 2);
  limits.quotas.back().text = "-1 100000";
  EXPECT_EQ(ChooseCpuThreads(limits, 0, 1).threads, 4);
}

TEST(ChooseCpuThreads, WorkersOnTheHostShareItsCpus) {
  const CpuBudget budget = ChooseCpuThreads(Limits(2), 0, /*workers_on_host=*/2);
  EXPECT_EQ(budget.threads, 1);
  EXPECT_EQ(budget.reason,
            "1 thread: affinity allows 2 CPUs, no cgroup CPU quota, 2 workers on this host -> 1");
  EXPECT_EQ(ChooseCpuThreads(Limits(2), 0, /*workers_on_host=*/4).threads, 1);
  EXPECT_EQ(ChooseCpuThreads(Limits(8), 0, /*workers_on_host=*/3).threads, 2);
  EXPECT_EQ(ChooseCpuThreads(Limits(2), 0, /*workers_on_host=*/0).threads, 2);
}

TEST(ChooseCpuThreads, AnExplicitCountWins) {
  const CpuBudget budget = ChooseCpuThreads(Limits(2, "100000 100000"), /*explicit_threads=*/4, 2);
  EXPECT_EQ(budget.threads, 4);
  EXPECT_THAT(budget.reason, HasSubstr("4 threads: set explicitly"));
  EXPECT_THAT(budget.reason, HasSubstr("would be 1 thread"));
}

TEST(ChooseCpuThreads, AMalformedQuotaIsIgnoredAndSaysSo) {
  for (const char* text : {"garbage", "100000", "0 100000", "100000 0", "x 100000", "1 2 3"}) {
    const CpuBudget budget = ChooseCpuThreads(Limits(2, text), 0, 1);
    EXPECT_EQ(budget.threads, 2) << text;
    EXPECT_THAT(budget.reason, HasSubstr("malformed, ignored")) << text;
    EXPECT_THAT(budget.reason, Not(HasSubstr("no cgroup CPU quota"))) << text;
  }
}

TEST(ChooseCpuThreads, UnknownAffinityFallsBackToHardwareConcurrency) {
  EXPECT_EQ(ChooseCpuThreads(Limits(0, "", /*hardware=*/6), 0, 1).threads, 6);
  EXPECT_EQ(ChooseCpuThreads(Limits(0), 0, 1).threads, 1);
}

// A fake system tree under a temp dir: /proc/self/cgroup and the cgroup
// files it leads to.
class FakeTree {
 public:
  void Write(const std::string& path, const std::string& contents) {
    const std::filesystem::path full = dir_.path() + path;
    std::filesystem::create_directories(full.parent_path());
    std::ofstream out(full);
    out << contents;
  }
  void MakeDir(const std::string& path) {
    std::filesystem::create_directories(dir_.path() + path);
  }
  const std::string& root() const { return dir_.path(); }

 private:
  testing::TempDir dir_;
};

TEST(ReadCpuLimits, ReadsTheCgroupV2QuotaOfTheProcessAndItsAncestors) {
  FakeTree tree;
  tree.Write("/proc/self/cgroup", "0::/job.slice/worker\n");
  tree.Write("/sys/fs/cgroup/job.slice/worker/cpu.max", "max 100000\n");
  tree.Write("/sys/fs/cgroup/job.slice/cpu.max", "150000 100000\n");
  const CpuLimits limits = ReadCpuLimits(tree.root());
  ASSERT_EQ(limits.quotas.size(), 2u);
  EXPECT_EQ(limits.quotas[0].path, "/sys/fs/cgroup/job.slice/worker/cpu.max");
  EXPECT_EQ(limits.quotas[0].text, "max 100000");
  EXPECT_EQ(limits.quotas[1].text, "150000 100000");
  CpuLimits two_cpus = limits;
  two_cpus.affinity_cpus = 2;
  two_cpus.hardware_threads = 2;
  const CpuBudget budget = ChooseCpuThreads(two_cpus, 0, 1);
  EXPECT_EQ(budget.threads, 1);
  EXPECT_EQ(budget.reason,
            "1 thread: affinity allows 2 CPUs, cgroup cpu.max 150000/100000 = 1.5 -> 1");
}

TEST(ReadCpuLimits, ReadsTheMountWhenTheCgroupPathIsTheHosts) {
  FakeTree tree;
  tree.Write("/proc/self/cgroup", "0::/kubepods/pod1/abc\n");
  tree.Write("/sys/fs/cgroup/cpu.max", "250000 100000\n");
  const CpuLimits limits = ReadCpuLimits(tree.root());
  ASSERT_EQ(limits.quotas.size(), 1u);
  EXPECT_EQ(limits.quotas[0].path, "/sys/fs/cgroup/cpu.max");
  EXPECT_EQ(limits.quotas[0].text, "250000 100000");
}

TEST(ReadCpuLimits, ReadsCgroupV1CfsFiles) {
  FakeTree tree;
  tree.Write("/proc/self/cgroup",
             "12:memory:/docker/abc\n"
             "4:cpu,cpuacct:/docker/abc\n"
             "1:name=systemd:/docker/abc\n");
  tree.Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "100000\n");
  tree.Write("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  tree.Write("/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us", "-1\n");
  tree.Write("/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_period_us", "100000\n");
  const CpuLimits limits = ReadCpuLimits(tree.root());
  ASSERT_EQ(limits.quotas.size(), 2u);
  EXPECT_EQ(limits.quotas[0].name, "cpu.cfs_quota_us");
  EXPECT_EQ(limits.quotas[0].text, "100000 100000");
  EXPECT_EQ(limits.quotas[1].text, "-1 100000");
  CpuLimits four_cpus = limits;
  four_cpus.affinity_cpus = 4;
  EXPECT_EQ(ChooseCpuThreads(four_cpus, 0, 1).threads, 1);
}

TEST(ReadCpuLimits, AMalformedFileIsReportedNotFatal) {
  FakeTree tree;
  tree.Write("/proc/self/cgroup", "0::/\n");
  tree.Write("/sys/fs/cgroup/cpu.max", "lots\n");
  CpuLimits limits = ReadCpuLimits(tree.root());
  ASSERT_EQ(limits.quotas.size(), 1u);
  limits.affinity_cpus = 2;
  limits.hardware_threads = 2;
  const CpuBudget budget = ChooseCpuThreads(limits, 0, 1);
  EXPECT_EQ(budget.threads, 2);
  EXPECT_THAT(budget.reason,
              HasSubstr("cgroup cpu.max 'lots' (/sys/fs/cgroup/cpu.max) is malformed, ignored"));
}

TEST(ReadCpuLimits, NoCgroupFilesIsNoQuota) {
  FakeTree tree;
  EXPECT_TRUE(ReadCpuLimits(tree.root()).quotas.empty());
  tree.Write("/proc/self/cgroup", "0::/a\n");
  tree.MakeDir("/sys/fs/cgroup/a");
  EXPECT_TRUE(ReadCpuLimits(tree.root()).quotas.empty());
}

TEST(ReadCpuLimits, SeesThisProcesssAffinity) {
  const CpuLimits limits = ReadCpuLimits();
  EXPECT_GE(limits.affinity_cpus, 1);
  EXPECT_GE(ChooseCpuThreads(limits, 0, 1).threads, 1);
}

}  // namespace
}  // namespace eps
