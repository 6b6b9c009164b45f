#include "worker/shard_loader.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <span>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/data_schema.h"
#include "core/logging.h"

namespace eps {

namespace {

// Malformed lines logged per worker before only counting them.
constexpr int kMalformedLogLimit = 10;
// Malformed-line samples sent to the master per commit.
constexpr int kMalformedSamplesPerCommit = 3;

}  // namespace

// A bounded queue between the loader and the trainer. Close() ends it with
// a status; Pop then drains what is left and returns null.
class ShardLoader::BatchQueue {
 public:
  explicit BatchQueue(size_t capacity) : capacity_(capacity) {}

  // Blocks while full. False if the queue was closed (the item is dropped).
  bool Push(std::unique_ptr<PreparedBatch> item) {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || items_.size() < capacity_;
    };
    mu_.Await(absl::Condition(&room));
    if (closed_) return false;
    items_.push_back(std::move(item));
    return true;
  }

  // Blocks until an item or the end. Null at the end.
  std::unique_ptr<PreparedBatch> Pop() {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || !items_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    if (items_.empty()) return nullptr;
    std::unique_ptr<PreparedBatch> item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

  // Ends the queue; the first status given is kept. Items still queued are
  // dropped when `drop` is set.
  void Close(const Status& status, bool drop = false) {
    absl::MutexLock lock(&mu_);
    if (!closed_) status_ = status;
    closed_ = true;
    if (drop) items_.clear();
  }

  Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<PreparedBatch>> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  Status status_ ABSL_GUARDED_BY(mu_);
};

ShardLoader::ShardLoader(const ShardLoaderOptions& options, SocketFactory* factory,
                         proto::NodeId self, const RecordParser* parser,
                         std::atomic<int>* malformed_logged, Hooks hooks)
    : options_(options),
      factory_(factory),
      self_(std::move(self)),
      parser_(parser),
      malformed_logged_(malformed_logged),
      hooks_(std::move(hooks)),
      queue_(std::make_unique<BatchQueue>(options.prefetch_batches)),
      batch_size_(options.batch_size) {}

ShardLoader::~ShardLoader() { Stop(); }

void ShardLoader::Start() {
  CHECK(!thread_.joinable()) << "ShardLoader started twice";
  thread_ = std::thread([this] { Loop(); });
}

std::unique_ptr<PreparedBatch> ShardLoader::Pop() { return queue_->Pop(); }

void ShardLoader::Stop() {
  // The loader may be blocked on a full queue: closing it frees it.
  queue_->Close(absl::CancelledError("worker stopping"), /*drop=*/true);
  if (thread_.joinable()) thread_.join();
}

Status ShardLoader::status() const { return queue_->status(); }

void ShardLoader::Loop() {
  RpcChannel master(factory_, self_);
  std::unique_ptr<PsClient> ps = hooks_.make_ps_client(&master);
  Status status = LoadShards(master, *ps);
  if (!status.ok()) status = hooks_.failed(status);
  queue_->Close(status);
}

Status ShardLoader::LoadShards(RpcChannel& master, PsClient& ps) {
  while (!hooks_.stopping()) {
    ASSIGN_OR_RETURN(Message reply, hooks_.call_master(master, [] {
                       Message request;
                       request.header().set_method(proto::GET_SHARD);
                       request.header().mutable_get_shard_request();
                       return request;
                     }));
    const proto::GetShardReply& body = reply.header().get_shard_reply();
    switch (body.action()) {
      case proto::GetShardReply::FINISHED:
        hooks_.finished();
        return absl::OkStatus();
      case proto::GetShardReply::WAIT:
        hooks_.sleep(absl::Milliseconds(std::max<uint32_t>(5, body.retry_after_ms())));
        break;
      case proto::GetShardReply::ASSIGNED:
        RETURN_IF_ERROR(LoadShard(master, body.shard(), ps));
        break;
      default:
        return absl::DataLossError("GET_SHARD reply without an action");
    }
  }
  return absl::OkStatus();
}

Status ShardLoader::MaybeSplit(RpcChannel& master, const proto::ShardAssignment& shard,
                               LineReader& reader) {
  if (split_shard_.load() != static_cast<int64_t>(shard.shard_id())) return absl::OkStatus();
  split_shard_.store(-1);
  // Give up the second half of what is left unread; too little left keeps it.
  const uint64_t from = reader.offset();
  StatusOr<std::optional<LinePosition>> found =
      FindMiddleLine(shard.path(), from, reader.line_number() + 1, reader.end());
  if (!found.ok()) {
    // The reader will meet the same problem and report the shard.
    LOG(WARNING) << "not splitting shard " << shard.shard_id() << ": " << found.status();
    return absl::OkStatus();
  }
  const std::optional<LinePosition> middle = *found;
  if (!middle.has_value()) return absl::OkStatus();
  const uint64_t old_end = reader.end();
  // The master treats a repeated split as the same split, so a retry after
  // a lost reply is safe.
  StatusOr<Message> reply = hooks_.call_master(master, [&] {
    Message request;
    request.header().set_method(proto::SPLIT_SHARD);
    proto::SplitShardRequest* body = request.header().mutable_split_shard_request();
    body->set_shard_id(shard.shard_id());
    body->set_epoch(shard.epoch());
    body->set_phase(shard.phase());
    body->set_split_offset(middle->offset);
    body->set_split_line(middle->line);
    return request;
  });
  RETURN_IF_ERROR_CTX(reply.status(), absl::StrCat("split of shard ", shard.shard_id()));
  if (!reply->header().split_shard_reply().accepted()) {
    VLOG(1) << "the master no longer wants shard " << shard.shard_id() << " split";
    return absl::OkStatus();
  }
  reader.Truncate(middle->offset);
  LOG(INFO) << "gave lines " << middle->line << "+ of shard " << shard.shard_id() << " ("
            << shard.path() << " bytes " << middle->offset << "-" << old_end << ") to shard "
            << reply->header().split_shard_reply().new_shard_id() << " for an idle worker";
  return absl::OkStatus();
}

Status ShardLoader::LoadShard(RpcChannel& master, const proto::ShardAssignment& shard,
                              PsClient& ps) {
  VLOG(1) << (shard.phase() == proto::EVAL ? "eval" : "train") << " shard " << shard.shard_id()
          << ": " << shard.path() << " from line " << shard.start_line() << " ("
          << shard.records() << " records)";
  // A file that cannot be read from `at` (line `line`) on ends the shard's
  // batches with a marker, after those already queued.
  auto unreadable = [&](uint64_t at, uint64_t line, const Status& why) -> Status {
    LOG(WARNING) << "cannot read shard " << shard.shard_id() << " (" << shard.path()
                 << " from line " << line << "): " << why.message() << "; telling the master";
    auto marker = std::make_unique<PreparedBatch>();
    marker->shard = shard;
    marker->begin = marker->end = at;
    marker->unreadable = std::string(why.message());
    if (marker->unreadable.empty()) marker->unreadable = why.ToString();
    marker->unreadable_line = line;
    queue_->Push(std::move(marker));
    return absl::OkStatus();
  };
  StatusOr<std::unique_ptr<LineReader>> opened =
      LineReader::Open(shard.path(), shard.start(), shard.end(), shard.start_line());
  if (!opened.ok()) return unreadable(shard.start(), shard.start_line(), opened.status());
  std::unique_ptr<LineReader> reader = *std::move(opened);
  const Schema& schema = parser_->schema();
  BatchBuilder builder(schema.num_dense, schema.num_cat);
  std::vector<float> dense(schema.num_dense);
  std::vector<uint64_t> ids(schema.num_cat);
  std::vector<uint32_t> field_ends(schema.num_cat);
  const bool multi_value = schema.has_multi_value();
  uint64_t offset = shard.start();
  uint64_t line_at_offset = shard.start_line();
  while (offset < reader->end()) {
    RETURN_IF_ERROR(MaybeSplit(master, shard, *reader));
    if (offset >= reader->end()) break;
    auto prepared = std::make_unique<PreparedBatch>();
    prepared->shard = shard;
    prepared->begin = offset;
    absl::string_view line;
    const int64_t batch_size = batch_size_.load();
    while (builder.size() < batch_size && reader->Next(&line)) {
      ++prepared->lines;
      float label = 0;
      Status parsed =
          multi_value
              ? parser_->Parse(line, &label, std::span<float>(dense), &ids, field_ends)
              : parser_->Parse(line, &label, std::span<float>(dense), std::span<uint64_t>(ids));
      if (parsed.ok()) {
        if (multi_value) {
          builder.Add(label, dense, ids, field_ends);
        } else {
          builder.Add(label, dense, ids);
        }
        continue;
      }
      ++prepared->malformed;
      const std::string where =
          absl::StrCat(shard.path(), ":", reader->line_number(), ": ", parsed.message());
      if (malformed_logged_->fetch_add(1) < kMalformedLogLimit) {
        LOG(WARNING) << "skipping malformed line " << where;
      }
      if (prepared->malformed_examples.size() < kMalformedSamplesPerCommit) {
        prepared->malformed_examples.push_back(where);
      }
    }
    if (!reader->status().ok()) {
      builder.Finish();  // the lines of a batch cut short are not trained
      return unreadable(offset, line_at_offset, reader->status());
    }
    prepared->end = reader->offset();
    if (prepared->lines == 0) {
      return unreadable(offset, line_at_offset,
                        absl::DataLossError(absl::StrCat("no line at byte ", offset,
                                                         " although the shard ends at ",
                                                         reader->end(), " (the file changed?)")));
    }
    prepared->batch = builder.Finish();
    if (prepared->batch.size() > 0) RETURN_IF_ERROR(hooks_.prepare(ps, *prepared));
    offset = prepared->end;
    line_at_offset += prepared->lines;
    if (!queue_->Push(std::move(prepared))) return absl::OkStatus();
    if (hooks_.stopping()) return absl::OkStatus();  // the rest goes back
  }
  return absl::OkStatus();
}

}  // namespace eps
