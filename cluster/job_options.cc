#include "cluster/job_options.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace eps {

void AddSharedOptions(const std::vector<std::pair<std::string, std::string>>& shared,
                      google::protobuf::RepeatedPtrField<proto::JobOption>* options) {
  for (const auto& [name, value] : shared) {
    proto::JobOption* option = options->Add();
    option->set_name(name);
    option->set_value(value);
  }
}

Status CheckSharedOptions(const JobConfig& master,
                          const google::protobuf::RepeatedPtrField<proto::JobOption>& member,
                          absl::string_view who) {
  std::vector<std::pair<std::string, std::string>> theirs;
  for (const proto::JobOption& option : member) theirs.emplace_back(option.name(), option.value());
  const std::string differences = DescribeOptionDifferences(theirs, master.SharedOptions());
  if (differences.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the job options of this ", who, " differ from the master's: ", differences,
                   "; start every process of the job with the master's config (and its "
                   "--section.key overrides)"));
}

}  // namespace eps
