// `weft store --port P [--host H]`: the rendezvous store on its own, in the foreground until
// SIGINT or SIGTERM, for jobs whose agents should not host it (multi-node runs, tests).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/store/auth.h"
#include "comm/store/tcp_store_server.h"
#include "launch/args.h"
#include "launch/commands.h"

namespace weft::launch {
namespace {

constexpr const char* kHelp =
    "usage: weft store --port P [--host H] [--token-file F] [--insecure] [limits...]\n"
    "\n"
    "Runs the TCP rendezvous store in the foreground until SIGINT or SIGTERM.\n"
    "  --port P              port to listen on; 0 picks a free one (printed on stdout)\n"
    "  --host H              address to listen on, and only there (default 127.0.0.1: this\n"
    "                        machine; 0.0.0.0 every interface, which needs a job token)\n"
    "  --token-file F        the job token (else $WEFT_JOB_TOKEN, else $WEFT_JOB_TOKEN_FILE);\n"
    "                        clients prove they hold it (HMAC challenge, never sent)\n"
    "  --insecure            serve any client without a token, even off this machine\n"
    "  --max-value-bytes N   longest value a key may hold (default 64 MiB)\n"
    "  --max-client-bytes N  memory one connection may make the server hold (default 256 MiB)\n"
    "  --max-total-bytes N   memory the whole store may hold (default 1 GiB)\n"
    "  --read-timeout-ms T   a started frame must arrive whole within T (default 30000)\n"
    "  --idle-timeout-ms T   close connections idle for T (default 0: never)\n"
    "  --bound-key-grace-ms T  keys bound to a connection outlive its close (without the\n"
    "                        client's goodbye) by T (default 250; 0: they go with it)\n"
    "\n"
    "Prints `weft store: listening on HOST:PORT` once it accepts connections. Data is kept in\n"
    "memory only and is gone when the store stops.\n";

size_t positive_size(const Args& a, const std::string& opt, size_t fallback) {
  int64_t v = a.get_int(opt, static_cast<int64_t>(fallback));
  if (v <= 0)
    throw ConfigError(opt, "must be a positive number of bytes, got " + std::to_string(v));
  return static_cast<size_t>(v);
}

}  // namespace

int cmd_store(const std::vector<std::string>& args) {
  if (std::any_of(args.begin(), args.end(),
                  [](const std::string& s) { return s == "--help" || s == "-h"; })) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  Args a(args,
         {"--port", "--host", "--token-file", "--max-value-bytes", "--max-client-bytes",
          "--max-total-bytes", "--read-timeout-ms", "--idle-timeout-ms", "--bound-key-grace-ms"},
         {"--insecure"});
  if (!a.positional().empty())
    throw ConfigError(a.positional()[0], "unexpected argument (see --help)");
  a.required("--port");
  int64_t port = a.get_int("--port", -1);
  if (port < 0 || port > 65535) throw ConfigError("--port", "expected a port number 0..65535");

  comm::TCPStoreServerOptions opts;
  opts.host = a.get_or("--host", "127.0.0.1");
  opts.insecure = a.flag("--insecure");
  opts.token = a.has("--token-file")
                   ? comm::auth::read_token_file(a.get_or("--token-file", ""), "--token-file")
                   : comm::auth::token_from_env();
  if (opts.token.empty() && !opts.insecure && !comm::auth::is_loopback(opts.host))
    throw ConfigError("--host", opts.host +
                                    " is reachable from other machines and there is no job "
                                    "token: set WEFT_JOB_TOKEN (or --token-file), or pass "
                                    "--insecure");
  opts.port = static_cast<uint16_t>(port);
  opts.max_value_bytes = positive_size(a, "--max-value-bytes", opts.max_value_bytes);
  opts.max_client_bytes = positive_size(a, "--max-client-bytes", opts.max_client_bytes);
  opts.max_total_bytes = positive_size(a, "--max-total-bytes", opts.max_total_bytes);
  opts.read_timeout = comm::Millis(
      positive_size(a, "--read-timeout-ms", size_t(opts.read_timeout.count())));
  opts.idle_timeout = comm::Millis(a.get_int("--idle-timeout-ms", 0));
  if (opts.idle_timeout.count() < 0)
    throw ConfigError("--idle-timeout-ms", "must be 0 (never) or a positive number of ms");
  opts.bound_key_grace =
      comm::Millis(a.get_int("--bound-key-grace-ms", opts.bound_key_grace.count()));
  if (opts.bound_key_grace.count() < 0)
    throw ConfigError("--bound-key-grace-ms", "must be 0 (at once) or a positive number of ms");

  // Block the stop signals before the server starts its thread (which inherits the mask),
  // so that they are only ever taken here, by sigwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  comm::TCPStoreServer server(opts);
  std::printf("weft store: listening on %s:%u\n", server.host().c_str(), unsigned(server.port()));
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  server.stop();
  auto s = server.stats();
  std::fprintf(stderr,
               "weft store: stopped by %s after %llu connections, %llu requests "
               "(%llu dropped for malformed frames, %llu over a memory bound, %llu timed out, "
               "%llu refused for the token)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", (unsigned long long)s.connections_accepted,
               (unsigned long long)s.requests, (unsigned long long)s.dropped_malformed,
               (unsigned long long)s.dropped_over_limit, (unsigned long long)s.dropped_timeout,
               (unsigned long long)s.refused_auth);
  return 0;
}

}  // namespace weft::launch
