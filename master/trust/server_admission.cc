#include "master/trust/server_admission.h"

#include "absl/strings/str_cat.h"

namespace eps {

Status ServerAdmission::CheckClaim(const proto::RegisterServerRequest& request) const {
  if (credentials_ == nullptr) return absl::OkStatus();
  const uint32_t slot = request.stored_server_id();
  if (credentials_->VerifyServer(slot, request.slot_credential())) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "the server at ", request.endpoint(), " (", request.hostname(), " pid ", request.pid(),
      ") claims ps[", slot, "] ",
      request.slot_credential().empty() ? "without its credential" : "with another's credential",
      " (DATA_DIR/SERVER_CREDENTIAL, written when the master admitted the slot's server): a "
      "server takes a slot back only from the --data-dir it served it from; start it on a fresh "
      "--data-dir to replace a dead server"));
}

Status ServerAdmission::CheckJoin(const proto::RegisterServerRequest& request) const {
  if (credentials_ == nullptr) return absl::OkStatus();
  const std::string& secret = request.launch_secret();
  if (request.launch_id() != 0) {
    if (verify_launch_ && verify_launch_(request.launch_id(), secret)) return absl::OkStatus();
  } else if (!http_token_.empty() && SameSecret(secret, http_token_)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the server at ", request.endpoint(), " (", request.hostname(), " pid ", request.pid(),
      ") would join the running job in a new slot, which takes an operator's or the "
      "autoscaler's grant: ",
      request.launch_id() != 0
          ? absl::StrCat("launch id ", request.launch_id(),
                         " is not one the server autoscaler started with that secret")
          : (secret.empty() ? std::string("it carries none")
                            : std::string("its secret is not the job's HTTP token")),
      "; to add a server by hand, start it with EPS_LAUNCH_SECRET_FILE=KEYS/http_token"));
}

std::string ServerAdmission::Credential(uint32_t slot) const {
  return credentials_ == nullptr ? std::string() : credentials_->ServerCredential(slot);
}

}  // namespace eps
