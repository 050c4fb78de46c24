// `weft run`'s command line: every torchrun flag in both spellings and both value forms,
// PET_ variables under the command line, the checks between flags, and refuse_not_yet.
#include "launch/run_options.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "base/error.h"

namespace weft::launch {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup env_of(const Env& e) {
  return [e](const std::string& name) -> std::optional<std::string> {
    auto it = e.find(name);
    if (it == e.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

RunOptions parse(const std::string& line, const Env& env = {}) {
  return parse_run_options(words(line), env_of(env));
}

// The ConfigError's field (the flag or variable it names) and message; fails when none.
std::string error_of(const std::string& line, const Env& env = {}) {
  try {
    parse(line, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for: " << line;
  return "";
}

std::string not_yet(const std::string& line) {
  RunOptions o = parse(line);
  try {
    refuse_not_yet(o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(RunOptions, DefaultsAreTorchrunsAndCommandFollowsDashDash) {
  RunOptions o = parse("-- weft train --config x.yaml");
  EXPECT_EQ(o.nnodes_min, 1);
  EXPECT_EQ(o.nnodes_max, 1);
  EXPECT_EQ(o.nproc_kind, NprocKind::kCount);
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.rdzv_backend, RdzvBackend::kC10d);
  EXPECT_EQ(o.rdzv_port, 29400);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_DOUBLE_EQ(o.monitor_interval, 0.1);
  EXPECT_EQ(o.role, "default");
  EXPECT_EQ(o.store_port, 0);
  EXPECT_EQ(o.grace, 5);
  EXPECT_FALSE(o.standalone);
  EXPECT_EQ(o.command, words("weft train --config x.yaml"));
  EXPECT_TRUE(o.origin.empty());
}

TEST(RunOptions, CommandStartsAtTheFirstNonOption) {
  RunOptions o = parse("--standalone --nproc-per-node 2 weft train --nnodes 9");
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.nnodes_max, 1);  // --nnodes 9 belongs to the command
  EXPECT_EQ(o.command, words("weft train --nnodes 9"));
  EXPECT_HAS(error_of("--standalone"), "COMMAND");
  EXPECT_TRUE(parse("--help").help);
  EXPECT_TRUE(parse("-h").help);
}

// Every value flag, in the four spellings: --dash value, --dash=value, --under value, --under=value.
TEST(RunOptions, EveryFlagInBothSpellingsAndBothValueForms) {
  struct Case {
    std::string flag, value;
    std::function<void(const RunOptions&)> check;
  };
  std::vector<Case> cases = {
      {"--nnodes", "2:4", [](const RunOptions& o) { EXPECT_EQ(o.nnodes_min, 2); EXPECT_EQ(o.nnodes_max, 4); }},
      {"--nproc-per-node", "3", [](const RunOptions& o) { EXPECT_EQ(o.nproc_per_node, 3); }},
      {"--rdzv-backend", "c10d", [](const RunOptions& o) { EXPECT_EQ(o.rdzv_backend, RdzvBackend::kC10d); }},
      {"--rdzv-endpoint", "node01:1234", [](const RunOptions& o) { EXPECT_EQ(o.rdzv_host, "node01"); EXPECT_EQ(o.rdzv_port, 1234); }},
      {"--rdzv-id", "job7", [](const RunOptions& o) { EXPECT_EQ(o.rdzv_id, "job7"); }},
      {"--rdzv-conf", "join_timeout=60", [](const RunOptions& o) { EXPECT_EQ(o.rdzv_conf.join_timeout, 60.0); }},
      {"--max-restarts", "3", [](const RunOptions& o) { EXPECT_EQ(o.max_restarts, 3); }},
      {"--monitor-interval", "0.5", [](const RunOptions& o) { EXPECT_DOUBLE_EQ(o.monitor_interval, 0.5); }},
      {"--log-dir", "/tmp/logs", [](const RunOptions& o) { EXPECT_EQ(o.log_dir, "/tmp/logs"); }},
      {"--redirects", "3", [](const RunOptions& o) { EXPECT_EQ(o.redirects.all, 3); }},
      {"--tee", "0:1", [](const RunOptions& o) { EXPECT_EQ(o.tee.of(0), 1); }},
      {"--local-ranks-filter", "0", [](const RunOptions& o) { EXPECT_EQ(o.local_ranks_filter, std::vector<int>{0}); }},
      {"--role", "trainer", [](const RunOptions& o) { EXPECT_EQ(o.role, "trainer"); }},
      {"--grace", "9", [](const RunOptions& o) { EXPECT_EQ(o.grace, 9); }},
  };
  for (const Case& c : cases) {
    std::string under = "--";
    for (char ch : c.flag.substr(2)) under += ch == '-' ? '_' : ch;
    // --nnodes 2:4 needs an endpoint to be valid (the store of several nodes).
    std::string extra = c.flag == "--nnodes" ? " --rdzv-endpoint h:1" : "";
    for (const std::string& spelled : {c.flag, under}) {
      for (bool eq : {false, true}) {
        std::string line = spelled + (eq ? "=" : " ") + c.value + extra + " -- cmd";
        SCOPED_TRACE(line);
        RunOptions o = parse(line);
        c.check(o);
        EXPECT_EQ(o.origin.at(c.flag), spelled);
      }
    }
  }
  // The static-only flags, and Weft's --store-port (standalone only).
  RunOptions s = parse("--rdzv_backend=static --node_rank 1 --nnodes 2 --master_addr=h "
                       "--master-port 1234 -- cmd");
  EXPECT_EQ(s.rdzv_backend, RdzvBackend::kStatic);
  EXPECT_EQ(s.node_rank, 1);
  EXPECT_EQ(s.master_addr, "h");
  EXPECT_EQ(s.master_port, 1234);
  RunOptions p = parse("--standalone --store_port=4321 --no_python -- cmd");
  EXPECT_TRUE(p.standalone);
  EXPECT_TRUE(p.no_python);
  EXPECT_EQ(p.store_port, 4321);
  // torchrun's short forms.
  RunOptions r = parse("-r 1 -t2 --nproc-per-node 2 -- cmd");
  EXPECT_EQ(r.redirects.all, 1);
  EXPECT_EQ(r.tee.all, 2);
  EXPECT_EQ(r.origin.at("--redirects"), "-r");
}

TEST(RunOptions, LastOccurrenceWins) {
  EXPECT_EQ(parse("--nproc-per-node 2 --nproc_per_node=5 -- cmd").nproc_per_node, 5);
}

TEST(RunOptions, NprocWords) {
  EXPECT_EQ(parse("--nproc-per-node auto -- c").nproc_kind, NprocKind::kAuto);
  EXPECT_EQ(parse("--nproc-per-node gpu -- c").nproc_kind, NprocKind::kGpu);
  EXPECT_EQ(parse("--nproc-per-node cpu -- c").nproc_kind, NprocKind::kCpu);
  RunOptions a = parse("--nproc-per-node auto -- c");
  EXPECT_EQ(resolve_nproc_per_node(a, 4, 32), 4);  // GPUs visible: one worker per GPU
  EXPECT_EQ(resolve_nproc_per_node(a, 0, 32), 32);  // none: the CPU count
  EXPECT_EQ(resolve_nproc_per_node(parse("--nproc-per-node cpu -- c"), 4, 32), 32);
  EXPECT_EQ(resolve_nproc_per_node(parse("--nproc-per-node 3 -- c"), 4, 32), 3);
  try {
    resolve_nproc_per_node(parse("--nproc-per-node gpu -- c"), 0, 32);
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "--nproc-per-node");
  }
  std::string e = error_of("--nproc-per-node many -- c");
  EXPECT_HAS(e, "--nproc-per-node");
  EXPECT_HAS(e, "auto");
  EXPECT_HAS(error_of("--nproc-per-node 0 -- c"), "--nproc-per-node");
}

TEST(RunOptions, EnvironmentFillsWhatTheCommandLineLeaves) {
  Env env = {{"PET_NPROC_PER_NODE", "4"}, {"PET_NNODES", "1:3"}, {"PET_RDZV_ENDPOINT", "h:77"},
             {"PET_MAX_RESTARTS", "2"}, {"PET_RDZV_CONF", "timeout=5"}, {"PET_ROLE", "r"},
             {"PET_MONITOR_INTERVAL", "2"}, {"PET_LOG_DIR", "d"}, {"PET_TEE", "1"},
             {"PET_REDIRECTS", "2"}, {"PET_LOCAL_RANKS_FILTER", "0,3"}, {"PET_RDZV_ID", "j"},
             {"PET_GRACE", "7"}, {"PET_NO_PYTHON", "1"}};
  RunOptions o = parse("-- cmd", env);
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.nnodes_max, 3);
  EXPECT_EQ(o.rdzv_host, "h");
  EXPECT_EQ(o.rdzv_port, 77);
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_EQ(o.rdzv_conf.timeout, 5.0);
  EXPECT_EQ(o.role, "r");
  EXPECT_DOUBLE_EQ(o.monitor_interval, 2.0);
  EXPECT_EQ(o.log_dir, "d");
  EXPECT_EQ(o.tee.all, 1);
  EXPECT_EQ(o.redirects.all, 2);
  EXPECT_EQ(o.local_ranks_filter, (std::vector<int>{0, 3}));
  EXPECT_EQ(o.rdzv_id, "j");
  EXPECT_EQ(o.grace, 7);
  EXPECT_TRUE(o.no_python);
  EXPECT_EQ(o.origin.at("--nproc-per-node"), "PET_NPROC_PER_NODE");
  // The command line wins; an empty variable counts as unset.
  RunOptions c = parse("--nproc_per_node 2 -- cmd", {{"PET_NPROC_PER_NODE", "4"}, {"PET_ROLE", ""}});
  EXPECT_EQ(c.nproc_per_node, 2);
  EXPECT_EQ(c.origin.at("--nproc-per-node"), "--nproc_per_node");
  EXPECT_EQ(c.role, "default");
  // Static and standalone from the environment too.
  RunOptions s = parse("-- cmd", {{"PET_STANDALONE", "1"}, {"PET_STORE_PORT", "99"}});
  EXPECT_TRUE(s.standalone);
  EXPECT_EQ(s.store_port, 99);
  RunOptions t = parse("-- cmd", {{"PET_RDZV_BACKEND", "static"}, {"PET_NODE_RANK", "0"},
                                  {"PET_MASTER_ADDR", "m"}, {"PET_MASTER_PORT", "5"}});
  EXPECT_EQ(t.master_addr, "m");
  EXPECT_EQ(t.master_port, 5);
  // An error in a variable names the variable.
  std::string e = error_of("-- cmd", {{"PET_NNODES", "x"}});
  EXPECT_HAS(e, "PET_NNODES");
  EXPECT_HAS(error_of("-- cmd", {{"PET_STANDALONE", "maybe"}}), "PET_STANDALONE");
}

TEST(RunOptions, Endpoints) {
  RunOptions a = parse("--rdzv-endpoint node7 -- c");
  EXPECT_EQ(a.rdzv_host, "node7");
  EXPECT_EQ(a.rdzv_port, 29400);
  RunOptions b = parse("--rdzv-endpoint [::1]:555 -- c");
  EXPECT_EQ(b.rdzv_host, "::1");
  EXPECT_EQ(b.rdzv_port, 555);
  RunOptions c = parse("--rdzv-endpoint [fe80::2] -- c");
  EXPECT_EQ(c.rdzv_host, "fe80::2");
  EXPECT_EQ(c.rdzv_port, 29400);
  EXPECT_HAS(error_of("--rdzv-endpoint ::1:80 -- c"), "brackets");
  EXPECT_HAS(error_of("--rdzv-endpoint [::1 -- c"), "--rdzv-endpoint");
  EXPECT_HAS(error_of("--rdzv-endpoint h:99999 -- c"), "--rdzv-endpoint");
  EXPECT_HAS(error_of("--rdzv-endpoint h:x -- c"), "--rdzv-endpoint");
  EXPECT_HAS(error_of("--rdzv-endpoint :80 -- c"), "no host");
  EXPECT_TRUE(is_local_host("localhost"));
  EXPECT_TRUE(is_local_host("127.0.0.1"));
  EXPECT_TRUE(is_local_host("::1"));
  EXPECT_FALSE(is_local_host("node-that-is-not-here.example"));
}

TEST(RunOptions, RdzvConfKnowsItsKeys) {
  RunOptions o = parse(
      "--rdzv-conf join_timeout=600,last_call_timeout=30,close_timeout=30,heartbeat_interval=1,"
      "heartbeat_timeout=5,read_timeout=60,token_file=/t,is_host=true -- c");
  const RdzvConf& c = o.rdzv_conf;
  EXPECT_EQ(c.join_timeout, 600.0);
  EXPECT_EQ(c.last_call_timeout, 30.0);
  EXPECT_EQ(c.close_timeout, 30.0);
  EXPECT_EQ(c.heartbeat_interval, 1.0);
  EXPECT_EQ(c.heartbeat_timeout, 5.0);
  EXPECT_EQ(c.read_timeout, 60.0);
  EXPECT_EQ(c.token_file, "/t");
  EXPECT_EQ(c.is_host, true);
  EXPECT_EQ(c.keys.size(), 8u);
  EXPECT_EQ(parse("--rdzv-conf timeout=9 -- c").rdzv_conf.timeout, 9.0);  // join_timeout's old name
  EXPECT_HAS(error_of("--rdzv-conf timeout=9,join_timeout=8 -- c"), "--rdzv-conf timeout");
  // is_host is c10d's: it would do nothing with etcd or static.
  EXPECT_HAS(error_of("--rdzv-backend etcd --rdzv-endpoint h --rdzv-conf is_host=1 -- c"),
             "--rdzv-conf is_host");
  EXPECT_HAS(error_of("--rdzv-backend static --rdzv-conf is_host=0 -- c"), "--rdzv-conf is_host");
  EXPECT_EQ(parse("--rdzv-conf insecure=1 -- c").rdzv_conf.insecure, true);
  std::string e = error_of("--rdzv-conf join_timeuot=5 -- c");
  EXPECT_HAS(e, "join_timeuot");
  EXPECT_HAS(e, "did you mean join_timeout?");
  EXPECT_HAS(error_of("--rdzv-conf join_timeout=-1 -- c"), "--rdzv-conf join_timeout");
  EXPECT_HAS(error_of("--rdzv-conf join_timeout -- c"), "KEY=VALUE");
  EXPECT_HAS(error_of("--rdzv-conf is_host=maybe -- c"), "is_host");
  EXPECT_HAS(error_of("--rdzv-conf heartbeat_interval=5,heartbeat_timeout=1 -- c"),
             "heartbeat_timeout");
  EXPECT_HAS(error_of("--rdzv-conf insecure=true,token_file=/t -- c"), "insecure");
}

// bound_key_grace: seconds, 0 allowed (the hosted store drops a closed connection's keys at
// once); anything else refused naming the key; over etcd the peer check's grace.
TEST(RunOptions, RdzvConfBoundKeyGraceTakesSecondsAndRefusesBadValues) {
  EXPECT_EQ(parse("--rdzv-conf bound_key_grace=1.5 -- c").rdzv_conf.bound_key_grace, 1.5);
  EXPECT_EQ(parse("--rdzv-conf bound_key_grace=0 -- c").rdzv_conf.bound_key_grace, 0.0);
  EXPECT_FALSE(parse("-- c").rdzv_conf.bound_key_grace.has_value());
  for (const char* bad : {"-1", "x", "", "1s", "inf"}) {
    const std::string e = error_of(std::string("--rdzv-conf bound_key_grace=") + bad + " -- c");
    EXPECT_HAS(e, "--rdzv-conf bound_key_grace");
    EXPECT_HAS(e, "expected a number of seconds >= 0");
  }
  EXPECT_HAS(error_of("--rdzv-conf bound_key_grace_ms=5 -- c"), "did you mean bound_key_grace?");
  // Over etcd it is the peer check's grace (comm/elastic/peer_check.h).
  EXPECT_EQ(parse("--rdzv-backend etcd --rdzv-endpoint h --rdzv-conf bound_key_grace=1 -- c")
                .rdzv_conf.bound_key_grace,
            1.0);
  EXPECT_EQ(not_yet("--rdzv-endpoint h --rdzv-conf bound_key_grace=0.1 -- c"), "");
  EXPECT_EQ(not_yet("--rdzv-backend static --rdzv-conf bound_key_grace=0.1 -- c"), "");
  EXPECT_NE(not_yet("--standalone --rdzv-conf bound_key_grace=0.1 -- c"), "");
}

TEST(RunOptions, StdStreamsAndFilters) {
  RunOptions o = parse("--nproc-per-node 2 --redirects 0:1,1:2 --tee=3 -- c");
  EXPECT_EQ(o.redirects.of(0), 1);
  EXPECT_EQ(o.redirects.of(1), 2);
  EXPECT_EQ(o.tee.of(1), 3);
  EXPECT_HAS(error_of("--redirects 4 -- c"), "--redirects");
  EXPECT_HAS(error_of("--tee 0:x -- c"), "--tee");
  EXPECT_HAS(error_of("--tee 0-1 -- c"), "--tee");
  EXPECT_HAS(error_of("--nproc-per-node 2 --redirects 0:1,5:1 -- c"), "local rank 5");
  EXPECT_HAS(error_of("--nproc-per-node 2 --local-ranks-filter 0,2 -- c"), "--local-ranks-filter");
  EXPECT_HAS(error_of("--local-ranks-filter 0,a -- c"), "--local-ranks-filter");
}

TEST(RunOptions, EachErrorNamesTheFlag) {
  struct Bad {
    std::string line, names, says;
  };
  std::vector<Bad> bad = {
      {"--nnodes 4:2 --rdzv-endpoint h -- c", "--nnodes", "MIN 4 is larger than MAX 2"},
      {"--nnodes two -- c", "--nnodes", "integer"},
      {"--nnodes 0 -- c", "--nnodes", "integer in [1"},
      {"--max-restarts -1 -- c", "--max-restarts", "integer"},
      {"--monitor-interval 0 -- c", "--monitor-interval", "> 0"},
      {"--master-port 0 --rdzv-backend static -- c", "--master-port", "integer"},
      {"--store-port 70000 --standalone -- c", "--store-port", "0, 65535"},
      {"--grace soon -- c", "--grace", "seconds"},
      {"--worker-heartbeat-interval 0 -- c", "--worker-heartbeat-interval", "> 0"},
      {"--rdzv-backend zookeeper -- c", "--rdzv-backend", "c10d, static, etcd"},
      {"--rdzv-backend statik -- c", "--rdzv-backend", "did you mean static?"},
      {"--nprocs-per-node 2 -- c", "--nprocs-per-node", "did you mean --nproc-per-node?"},
      {"--bogus -- c", "--bogus", "unknown option"},
      {"--nproc-per-node", "--nproc-per-node", "needs a value"},
      {"--standalone=perhaps -- c", "--standalone", "true or false"},
      {"-hx -- c", "-h", "takes no value"},
      // --standalone is one machine with its own store: refused together with what it overrides.
      {"--standalone --rdzv-endpoint h:1 -- c", "--rdzv-endpoint", "conflicts with --standalone"},
      {"--standalone --rdzv-backend static -- c", "--rdzv-backend", "conflicts with --standalone"},
      {"--standalone --nnodes 2 -- c", "--nnodes", "one machine"},
      {"--store-port 5 -- c", "--store-port", "--standalone"},
      // Flags that belong to static rendezvous.
      {"--master-addr h -- c", "--master-addr", "static only"},
      {"--master-port 5 -- c", "--master-port", "static only"},
      {"--node-rank 1 -- c", "--node-rank", "static only"},
      {"--rdzv-backend static --nnodes 2 --master-addr h -- c", "--node-rank", "--node-rank 0..1"},
      {"--rdzv-backend static --nnodes 2 --node-rank 1 -- c", "--master-addr", "node 0"},
      {"--rdzv-backend static --nnodes 2 --node-rank 2 --master-addr h -- c", "--node-rank",
       "below --nnodes 2"},
      {"--rdzv-backend static --nnodes 1:2 -- c", "--nnodes", "fixed number"},
      {"--rdzv-backend static --rdzv-endpoint h -- c", "--rdzv-endpoint", "--master-addr"},
      {"--rdzv-backend etcd -- c", "--rdzv-endpoint", "etcd"},
      {"--nnodes 2 -- c", "--rdzv-endpoint", "several nodes"},
      // torchrun flags that do not apply to a launcher of commands.
      {"-m pkg -- c", "-m", "python -m MODULE"},
      {"--run-path -- c", "--run-path", "SCRIPT"},
      {"--start-method spawn -- c", "--start-method", "forks"},
  };
  for (const Bad& b : bad) {
    std::string e = error_of(b.line);
    EXPECT_EQ(e.rfind(b.names + ":", 0), 0u) << b.line << " -> " << e;
    EXPECT_HAS(e, b.says);
  }
  // The spelling the user typed is the one named.
  EXPECT_EQ(error_of("--master_addr h -- c").rfind("--master_addr:", 0), 0u);
  EXPECT_EQ(error_of("-- c", {{"PET_MODULE", "1"}}).rfind("PET_MODULE:", 0), 0u);
  EXPECT_NO_THROW(parse("-- c", {{"PET_MODULE", "0"}}));
}

TEST(RunOptions, StandaloneAcceptsRdzvIdAndExplicitC10d) {
  RunOptions o = parse("--standalone --rdzv-backend c10d --rdzv-id j -- c");
  EXPECT_TRUE(o.standalone);
  EXPECT_EQ(o.rdzv_id, "j");
}

TEST(RunOptions, StorePortToServe) {
  EXPECT_EQ(store_port_to_serve(parse("--standalone -- c")), 0);
  EXPECT_EQ(store_port_to_serve(parse("--standalone --store-port 7 -- c")), 7);
  EXPECT_EQ(store_port_to_serve(parse("-- c")), 29400);
  EXPECT_EQ(store_port_to_serve(parse("--rdzv-endpoint localhost:8 -- c")), 8);
  EXPECT_EQ(store_port_to_serve(parse("--rdzv-backend static -- c")), 29500);
}

TEST(RefuseNotYet, WhatTheLauncherDoesPasses) {
  EXPECT_EQ(not_yet("--standalone --nproc-per-node 4 -- c"), "");
  EXPECT_EQ(not_yet("--standalone --nproc_per_node=auto --store-port 5 --grace 2 --no-python "
                    "--nnodes 1:1 --max-restarts 0 --rdzv-backend c10d -- c"),
            "");
  // What the supervisor does: run id, log files, stream routing, console filter, role.
  EXPECT_EQ(not_yet("--standalone --rdzv-id j --log-dir d --redirects 3 -t 0:1 "
                    "--local_ranks_filter 0 --role worker --worker-heartbeat-timeout 9 -- c"),
            "");
}

// Several nodes of a fixed count: the c10d rendezvous at an endpoint, here or elsewhere.
TEST(RefuseNotYet, FixedNodeCountAtAnEndpointPasses) {
  EXPECT_EQ(not_yet("--nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint "
                    "node01:29400 --rdzv-id j -- c"),
            "");
  EXPECT_EQ(not_yet("--nnodes=3:3 --rdzv-endpoint localhost:5 --rdzv-id j -- c"), "");
  EXPECT_EQ(not_yet("--nnodes 1 --rdzv-endpoint 127.0.0.1:5 --rdzv-id j -- c"), "");
  // The rendezvous settings the agent uses, and --monitor-interval (its poll of the others).
  EXPECT_EQ(not_yet("--nnodes 2 --rdzv-endpoint h --rdzv-id j --monitor-interval 0.5 "
                    "--rdzv-conf join_timeout=60,last_call_timeout=5,heartbeat_interval=1,"
                    "heartbeat_timeout=4,insecure=1 -- c"),
            "");
}

TEST(CheckRendezvousOptions, NeedsTheRunIdAndTheJobToken) {
  Env none, token = {{"WEFT_JOB_TOKEN", "t"}}, file = {{"WEFT_JOB_TOKEN_FILE", "/t"}};
  auto error = [](const std::string& line, const Env& env) -> std::string {
    try {
      check_rendezvous_options(parse(line), env_of(env));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error("--nnodes 2 --rdzv-endpoint h --rdzv-id j -- c", token), "");
  EXPECT_EQ(error("--nnodes 2 --rdzv-endpoint h --rdzv-id j -- c", file), "");
  std::string e = error("--nnodes 2 --rdzv-endpoint h -- c", token);
  EXPECT_EQ(e.rfind("--rdzv-id:", 0), 0u) << e;
  // A loopback endpoint needs the token too: the agents are separate processes.
  for (const char* host : {"far.example", "127.0.0.1", "localhost"}) {
    e = error(std::string("--nnodes 2 --rdzv-endpoint ") + host + " --rdzv-id j -- c", none);
    EXPECT_EQ(e.rfind("WEFT_JOB_TOKEN:", 0), 0u) << e;
  }
  EXPECT_EQ(error("--nnodes 2 --rdzv-endpoint h --rdzv-id j --rdzv-conf insecure=1 -- c", none), "");
  EXPECT_EQ(error("--standalone -- c", none), "");  // the standalone agent makes one up
}

TEST(RefuseNotYet, NamesTheFlagOfEachMissingCapability) {
  struct Case {
    std::string line, names;
  };
  std::vector<Case> cases = {
      {"--rdzv-backend etcd-v2 --rdzv-endpoint h:2379 -- c", "--rdzv-backend"},
      {"-- c", "--standalone"},
      {"--nproc-per-node 2 -- c", "--standalone"},
      {"--standalone --rdzv-conf heartbeat_interval=1 -- c", "--rdzv-conf heartbeat_interval"},
      {"--rdzv-endpoint h --rdzv-conf join_timeout=9,close_timeout=1 -- c",
       "--rdzv-conf close_timeout"},
  };
  for (const Case& c : cases) {
    std::string e = not_yet(c.line);
    EXPECT_EQ(e.rfind(c.names + ":", 0), 0u) << c.line << " -> " << e;
    EXPECT_TRUE(e.find("not yet") != std::string::npos || e.find("not supported") != std::string::npos)
        << e;
  }
}

// Restarts, elastic ranges, etcd and a token file: what the node agent does now.
TEST(RefuseNotYet, ElasticFlagsPass) {
  EXPECT_EQ(not_yet("--nnodes 1:4 --rdzv-endpoint h --rdzv-id j -- c"), "");
  EXPECT_EQ(not_yet("--nnodes=2:3 --max-restarts 3 --rdzv-endpoint h --rdzv-id j -- c"), "");
  EXPECT_EQ(not_yet("--standalone --max-restarts 3 --monitor-interval 0.5 -- c"), "");
  EXPECT_EQ(not_yet("--rdzv-backend etcd --rdzv-endpoint h:2379 -- c"), "");
  EXPECT_EQ(not_yet("--rdzv-backend static --nnodes 2 --node-rank 1 --master-addr h "
                    "--master-port 7 -- c"),
            "");
  EXPECT_EQ(not_yet("--rdzv-backend static -- c"), "");
  EXPECT_EQ(not_yet("--nnodes 2 --rdzv-endpoint h --rdzv-conf token_file=/t,join_timeout=9 -- c"),
            "");
  EXPECT_EQ(not_yet("--rdzv-endpoint h --rdzv-conf timeout=9,read_timeout=1,is_host=0 -- c"), "");
}

TEST(RunOptions, EtcdTakesItsMembersAsAList) {
  RunOptions o = parse("--rdzv-backend etcd --rdzv-endpoint a:1,b,[::1]:3 -- c");
  EXPECT_EQ(o.rdzv_endpoints, (std::vector<std::string>{"a:1", "b:2379", "[::1]:3"}));
  EXPECT_EQ(o.rdzv_host, "a");
  EXPECT_EQ(parse("--rdzv-backend etcd --rdzv-endpoint h -- c").rdzv_endpoints,
            std::vector<std::string>{"h:2379"});
  EXPECT_EQ(parse("--rdzv-endpoint h:5 -- c").rdzv_endpoints, std::vector<std::string>{"h:5"});
  std::string e;
  try {
    parse("--rdzv-endpoint a:1,b:2 -- c");
  } catch (const ConfigError& x) {
    e = x.what();
  }
  EXPECT_EQ(e.rfind("--rdzv-endpoint:", 0), 0u) << e;
  EXPECT_HAS(e, "--rdzv-backend etcd");
}

TEST(RunOptions, TokenFileStandsForTheTokenVariables) {
  RunOptions o = parse("--nnodes 2 --rdzv-endpoint h --rdzv-id j --rdzv-conf token_file=/t -- c");
  EXPECT_NO_THROW(check_rendezvous_options(o, [](const std::string&) {
    return std::optional<std::string>();
  }));
}

}  // namespace
}  // namespace weft::launch
