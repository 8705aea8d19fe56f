// A Store kept in an etcd cluster (v3 API, through etcd's JSON gateway over HTTP), so that
// rendezvous has no single point of failure: no launcher agent hosts the store, and losing any
// one etcd member -- or any one node of the job, node 0 included -- leaves the store working as
// long as the etcd cluster keeps a quorum.
//
// Semantics, mapped onto etcd:
// - every key is written as "<prefix><key>"; the prefix names the job ("meshtrain/<rdzv id>/"),
//   so jobs sharing a cluster never see each other's keys. Keys outlive the job: a rendezvous
//   id names one job run (remove a finished job's keys with `etcdctl del --prefix <prefix>`).
// - add() is a compare-and-swap loop on the key's mod_revision; compare_set() one transaction
//   comparing the value (or, for "absent", the create revision 0).
// - get() and wait() watch the missing key from the revision at which it was seen missing, so
//   no write is lost between the read and the watch, and nothing polls.
// - several endpoints ("h1:2379,h2:2379,h3:2379"): a request that cannot reach a member (or gets
//   an "unavailable" answer while the cluster elects a leader) moves to the next one; only
//   when every member failed for the whole store timeout does it throw CommError naming every
//   endpoint and its error. add() stays exact across a failover: its transaction also records
//   a per-handle sequence number, so an add whose answer was lost is not applied twice.
//
// Authentication: etcd does not speak the job's HMAC handshake, so values are not signed with
// the job token; a store client proves itself the way etcd expects instead. With a user name
// (MESHTRAIN_ETCD_USER, password from MESHTRAIN_ETCD_PASSWORD or MESHTRAIN_ETCD_PASSWORD_FILE)
// the client authenticates and sends etcd's token with every request; https:// endpoints use
// TLS, verified against MESHTRAIN_ETCD_CACERT, with an optional client certificate
// (MESHTRAIN_ETCD_CERT, MESHTRAIN_ETCD_KEY). Anyone with write access to the prefix can take
// part in rendezvous, so production clusters should enable etcd auth (and a role limited to
// the "meshtrain/" prefix). The job token still guards every peer connection between workers.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/comm/store.h"

namespace meshtrain::comm {

struct EtcdStoreOptions {
  // "host:port", "[v6addr]:port", "http://host:port" or "https://host:port".
  std::vector<std::string> endpoints;
  // Written in front of every key.
  std::string prefix;
  // get/wait timeout, and how long a request keeps trying members before giving up.
  Duration timeout{std::chrono::seconds(300)};
  // Per attempt to connect to one member, and per ordinary request once connected.
  Duration connect_timeout{std::chrono::seconds(2)};
  Duration request_timeout{std::chrono::seconds(10)};
  std::string username;
  std::string password;
  std::string ca_file;    // https: the CA bundle (empty: the system's)
  std::string cert_file;  // https: client certificate and key (both or neither)
  std::string key_file;

  // username, password and TLS files from the MESHTRAIN_ETCD_* variables described above.
  static EtcdStoreOptions from_env();
};

// "h1:2379, h2:2379" -> {"h1:2379", "h2:2379"}; throws ValueError on an empty list or entry.
std::vector<std::string> parse_etcd_endpoints(const std::string& list);
// The key prefix of a job's rendezvous: "meshtrain/<rdzv_id>/". Throws ValueError on an empty id.
std::string etcd_job_prefix(const std::string& rdzv_id);

class EtcdStore : public Store {
 public:
  // Does not contact etcd yet: the first request does (with failover), so that constructing a
  // handle while one member is down succeeds.
  explicit EtcdStore(EtcdStoreOptions options);
  ~EtcdStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool remove(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::vector<std::string>& endpoints() const { return options_.endpoints; }
  const std::string& prefix() const { return options_.prefix; }

 private:
  struct Impl;

  EtcdStoreOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtrain::comm
