// A simulated trainer rank for integration tests: registers through the real client library,
// heartbeats, and can open a checkpoint round and hang mid-write so a test can kill it.
//
//   sim_rank --coordinator ADDR --token TOKEN --run RUN --node NODE --slot S
//            [--checkpoint-step K] [--hang-after-partial] [--adds N [--with-sets]]
// Prints "rank=R generation=G" once registered, "partial=DIR" after writing a partial checkpoint,
// "stop: REASON" when the coordinator tells it to stop (exit 3). With --adds: adds 1 to the store's
// "shared-counter" N times through the node's store combiner and prints "adds=V1,V2,..." (the
// values returned) and "carried=BATCHES/OPS" (what this process carried for the node). With
// --with-sets, each add follows a set of this rank's own key and a get of it, all through the
// combiner (the set's answer read before the get), and the get must return what the set just
// stored (exit 7 otherwise).
#include <unistd.h>

#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "client/agent.h"
#include "common/crypto.h"

// c10d's default store timeout: how long a store operation waits for its node's carrier.
constexpr absl::Duration kStoreTimeout = absl::Minutes(5);

int main(int argc, char** argv) {
  CLI::App app{"simulated dt rank"};
  std::string address, token, run, node;
  int slot = 0;
  int64_t checkpoint_step = 0;
  bool hang_after_partial = false;
  app.add_option("--coordinator", address)->required();
  app.add_option("--token", token)->required();
  app.add_option("--run", run)->required();
  app.add_option("--node", node)->required();
  app.add_option("--slot", slot);
  app.add_option("--checkpoint-step", checkpoint_step);
  app.add_flag("--hang-after-partial", hang_after_partial);
  int adds = 0;
  app.add_option("--adds", adds);
  bool with_sets = false;
  app.add_flag("--with-sets", with_sets);
  CLI11_PARSE(app, argc, argv);

  dt::ClientOptions options;
  options.address = address;
  options.token = token;
  auto client = dt::CoordinatorClient::Connect(options);
  if (!client.ok()) return 1;
  dt::AgentOptions id;
  id.run_id = run;
  id.node = node;
  id.local_slot = slot;
  id.host = dt::HostName();
  id.pid = ::getpid();
  dt::Agent agent(*client, id);
  auto assigned = agent.Register(absl::Minutes(1));
  if (!assigned.ok()) {
    std::cout << "register failed: " << assigned.status() << std::endl;
    return 2;
  }
  std::cout << "rank=" << assigned->rank() << " generation=" << assigned->generation() << std::endl;
  absl::Notification stopped;
  agent.StartHeartbeats([&](const std::string& reason) {
    std::cout << "stop: " << reason << std::endl;
    std::_Exit(3);
  });
  if (adds > 0) {
    auto session = agent.OpenStore();
    std::unique_ptr<dt::StoreCombiner> combiner = agent.OpenStoreCombiner();
    if (!session.ok() || combiner == nullptr) {
      std::cout << "no store or no combiner: " << session.status() << std::endl;
      return 5;
    }
    std::vector<int64_t> values;
    auto carry = [&](dt::v1::StoreRequest r) { return (*session)->CallCarrying(std::move(r)); };
    for (int i = 0; i < adds; ++i) {
      if (with_sets) {
        std::string key = absl::StrCat("own-", slot), value = absl::StrCat("value-", slot, "-", i);
        std::optional<absl::Status> set = combiner->Set(key, value, carry, kStoreTimeout);
        // A set is left for the node's carrier; its answer is read before the rank's next operation.
        if (set.has_value() && set->ok()) {
          set = combiner->SettleSet(carry, kStoreTimeout, [](const std::string&, std::string) {
            return absl::InternalError("went again on the rank's own stream: not carried");
          });
        }
        std::optional<absl::StatusOr<std::string>> got = combiner->GetIfPresent(key, carry, kStoreTimeout);
        if (!set.has_value() || !set->ok() || !got.has_value() || !got->ok() || **got != value) {
          std::cout << "set/get through the combiner: " << (set ? set->ToString() : "not carried") << " / "
                    << (got ? (got->ok() ? **got : got->status().ToString()) : "not carried") << std::endl;
          return 7;
        }
      }
      absl::StatusOr<int64_t> v = combiner->Add("shared-counter", 1, carry, kStoreTimeout);
      if (!v.ok()) {
        std::cout << "add failed: " << v.status() << std::endl;
        return 6;
      }
      values.push_back(*v);
    }
    std::cout << "adds=" << absl::StrJoin(values, ",") << "\ncarried=" << combiner->carried().batches << "/"
              << combiner->carried().ops << std::endl;
  }
  if (checkpoint_step > 0) {
    auto round = agent.BeginCheckpoint(checkpoint_step);
    if (!round.ok()) {
      std::cout << "begin failed: " << round.status() << std::endl;
      return 4;
    }
    if (round->writer_rank() == agent.rank()) {
      std::ofstream(round->partial_dir() + "/model.pt") << "half";
      std::cout << "partial=" << round->partial_dir() << std::endl;
      if (hang_after_partial) {
        while (true) ::pause();
      }
      dt::v1::Manifest m;
      auto* f = m.add_files();
      f->set_name("model.pt");
      f->set_size(4);
      f->set_sha256(dt::Sha256Hex("half"));
      auto c = agent.CommitCheckpoint(round->round_id(), &m);
      std::cout << "commit: " << (c.ok() ? "ok" : c.status().ToString()) << std::endl;
    } else {
      auto c = agent.CommitCheckpoint(round->round_id(), nullptr);
      std::cout << "commit: " << (c.ok() ? "ok" : c.status().ToString()) << std::endl;
    }
  }
  while (true) ::pause();
}
