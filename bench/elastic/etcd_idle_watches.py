#!/usr/bin/env python3
"""Issue 14: etcd watches that the agents of an idle three-node job (`weft run --rdzv-backend
etcd --nnodes 2:3`, one sleeping worker each, over one etcd member) make per second, for two
weft binaries side by side, from etcd's own counters: watch streams started
(grpc_server_started_total of etcdserverpb.Watch; each EtcdWatch is one) and watchers held
(etcd_debugging_mvcc_watcher_total) over a window after the job settled in epoch 1.

usage: python3 bench/elastic/etcd_idle_watches.py BEFORE_WEFT AFTER_WEFT [SECONDS] [RUNS]
  (two weft binaries; the same binary twice measures one build; needs /usr/bin/etcd)
  SECONDS: the window (default 20); RUNS: runs a side, alternating (default 1).
"""
import http.client, os, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from etcd_loss_detection import start_agents, start_etcd, stop_job, wait_epoch_one  # noqa: E402

STARTED = ('grpc_server_started_total{grpc_method="Watch",grpc_service="etcdserverpb.Watch",'
           'grpc_type="bidi_stream"}')
HELD = "etcd_debugging_mvcc_watcher_total"


def metrics(ep, names):
    host, port = ep.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    out = {}
    for line in body.splitlines():
        for n in names:
            if line.startswith(n + " "):
                out[n] = float(line[len(n) + 1:])
    missing = [n for n in names if n not in out]
    if missing:
        raise RuntimeError(f"not on etcd's /metrics page: {missing}")
    return out


def one(weft, run_id, seconds):
    d = tempfile.mkdtemp(prefix="weft_idlewatch_")
    etcd, ep = start_etcd(d)
    env = dict(os.environ, WEFT_JOB_TOKEN="idle-watch-measure")
    done = f"{d}/done"
    worker = f"echo world $GROUP_WORLD_SIZE epoch $WEFT_RDZV_EPOCH; while [ ! -f {done} ]; do sleep 0.1; done"
    args = [weft, "run", "--nnodes", "2:3", "--max-restarts", "1", "--nproc-per-node", "1",
            "--rdzv-backend", "etcd", "--rdzv-endpoint", ep, "--rdzv-id", run_id,
            "--rdzv-conf", "last_call_timeout=30", "--", "sh", "-c", worker]
    agents, read = start_agents(args, env, d)
    try:
        wait_epoch_one(read, 0.05)
        time.sleep(2)  # the agents' joins and first waits are behind them
        m0 = metrics(ep, [STARTED, HELD])
        t0 = time.monotonic()
        time.sleep(seconds)
        m1 = metrics(ep, [STARTED, HELD])
        span = time.monotonic() - t0
        open(done, "w").write("1")
        for a in agents:
            a.wait(timeout=60)
        return (m1[STARTED] - m0[STARTED]) / span / 3, m0[HELD], m1[HELD], span
    finally:
        stop_job(agents, etcd, d)


def main():
    before, after = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 20
    runs = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    for r in range(runs):
        for name, b in (("before", before), ("after", after)):
            rate, held0, held1, span = one(b, f"w{r}{name}{os.getpid()}", seconds)
            print(f"run {r} {name}: {rate:.2f} watches made per second per agent over "
                  f"{span:.1f} s; watchers held {held0:.0f} -> {held1:.0f}", flush=True)


if __name__ == "__main__":
    main()
