#!/usr/bin/env python3
"""Issue 14 / peer check: time from SIGKILL of one of three `weft run` agents (and its
workers) over etcd to the survivors' new epoch (elastic, --nnodes 2:3 --max-restarts 1) or
to their `failed: lost node` (fixed --nnodes 3), for two weft binaries side by side.

usage: python3 bench/elastic/etcd_loss_detection.py BEFORE_WEFT AFTER_WEFT [RUNS] [MODE] [VICTIM]
       [MONITOR_INTERVAL]
  (two weft binaries; the same binary twice measures one build; needs /usr/bin/etcd)
  MODE: elastic (default) or fixed. Default --rdzv-conf (heartbeat_timeout 5 s) otherwise.
  VICTIM: kill (default: SIGKILL, seen by the peer check) or stop (SIGSTOP: the agent's
  connections stay open, so only its alive key's lease running out tells; heartbeat_interval
  0.5 s, heartbeat_timeout 2 s). With stop, a watch of its own (POST /v3/watch, DELETE events
  only) stamps the moment etcd deleted the lost node's alive key, and the table gives the time
  from that deletion to the survivors' new epoch: the part the agents control.
  MONITOR_INTERVAL: the agents' --monitor-interval in seconds (default 0.1, weft run's).
"""
import base64, http.client, json, os, shutil, signal, socket, subprocess, sys, tempfile, \
    threading, time


def watch_alive_deletes(ep, stamps):
    """Appends time.monotonic() of each DELETE of a /weft/rdzv/*/alive/* key to `stamps`
    (a daemon thread's loop; the stream ends when etcd is killed)."""
    host, port = ep.split(":")
    b64 = lambda s: base64.b64encode(s.encode()).decode()
    conn = http.client.HTTPConnection(host, int(port))
    body = {"create_request": {"key": b64("/weft/rdzv/"), "range_end": b64("/weft/rdzv0"),
                               "filters": ["NOPUT"]}}
    conn.request("POST", "/v3/watch", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    created = threading.Event()

    def loop():
        try:
            while True:
                line = resp.readline()
                if not line:
                    return
                now = time.monotonic()
                r = json.loads(line).get("result", {})
                if r.get("created"):
                    created.set()
                for e in r.get("events", []):
                    if "/alive/" in base64.b64decode(e["kv"]["key"]).decode():
                        stamps.append(now)
        except Exception:
            return

    threading.Thread(target=loop, daemon=True).start()
    if not created.wait(5):
        raise RuntimeError("the bench's own etcd watch was not created")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def children(pid):
    out = []
    for n in os.listdir("/proc"):
        if not n.isdigit():
            continue
        try:
            stat = open(f"/proc/{n}/stat").read()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
            out.append(int(n))
    return out


def start_etcd(d):
    cp, pp = free_port(), free_port()
    url = lambda p: f"http://127.0.0.1:{p}"
    e = subprocess.Popen(
        ["/usr/bin/etcd", "--name", "m0", "--data-dir", f"{d}/etcd",
         "--listen-client-urls", url(cp), "--advertise-client-urls", url(cp),
         "--listen-peer-urls", url(pp), "--initial-advertise-peer-urls", url(pp),
         "--initial-cluster", f"m0={url(pp)}", "--initial-cluster-state", "new",
         "--heartbeat-interval", "25", "--election-timeout", "250"],
        stdout=open(f"{d}/etcd.log", "w"), stderr=subprocess.STDOUT)
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", cp), 0.1).close()
            time.sleep(0.3)
            return e, f"127.0.0.1:{cp}"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("etcd did not start")


def start_agents(args, env, d):
    """Starts three weft run agents of `args`, each logging to d/<i>.log; returns them and a
    reader of agent i's log so far."""
    logs = [f"{d}/{i}.log" for i in range(3)]
    agents = [subprocess.Popen(args, env=env, stdout=open(l, "w"), stderr=subprocess.STDOUT)
              for l in logs]
    return agents, lambda i: open(logs[i]).read()


def wait_epoch_one(read, pause):
    """Until every agent's worker says it is in world 3 of epoch 1 (60 s at most)."""
    t = time.time()
    while not all("world 3 epoch 1" in read(i) for i in range(3)):
        if time.time() - t > 60:
            raise RuntimeError("no epoch 1: " + read(0))
        time.sleep(pause)


def stop_job(agents, etcd, d):
    """Kills what is left of a bench job (agents still running, their workers, etcd) and
    removes its folder."""
    for a in agents:
        if a.poll() is None:
            a.kill()
            for k in children(a.pid):
                os.kill(k, signal.SIGKILL)
            a.wait()
    etcd.kill()
    etcd.wait()
    shutil.rmtree(d, ignore_errors=True)


def one(weft, run_id, mode, victim_signal, monitor="0.1"):
    d = tempfile.mkdtemp(prefix="weft_peercheck_")
    etcd, ep = start_etcd(d)
    deletes = []
    env = dict(os.environ, WEFT_JOB_TOKEN="peercheck-measure")
    done = f"{d}/done"
    worker = (f"echo world $GROUP_WORLD_SIZE epoch $WEFT_RDZV_EPOCH; while [ ! -f {done} ] || "
              f"[ $WEFT_RDZV_EPOCH != 2 ]; do sleep 0.05; done")
    nn = ["--nnodes", "2:3", "--max-restarts", "1"] if mode == "elastic" else ["--nnodes", "3"]
    conf = "last_call_timeout=30"
    if victim_signal == signal.SIGSTOP:
        conf += ",heartbeat_interval=0.5,heartbeat_timeout=2"
    args = [weft, "run", *nn, "--nproc-per-node", "1", "--monitor-interval", monitor,
            "--rdzv-backend", "etcd",
            "--rdzv-endpoint", ep, "--rdzv-id", run_id, "--rdzv-conf", conf,
            "--", "sh", "-c", worker]
    agents, read = start_agents(args, env, d)
    try:
        wait_epoch_one(read, 0.02)
        time.sleep(0.5)
        watch_alive_deletes(ep, deletes)
        victim = agents[2]
        kids = children(victim.pid)
        t0 = time.monotonic()
        victim.send_signal(victim_signal)
        for k in kids:
            os.kill(k, victim_signal)
        if victim_signal == signal.SIGKILL:
            victim.wait()
        mark = "world 2 epoch 2" if mode == "elastic" else "failed: "
        seen = [None, None]
        while None in seen and time.monotonic() - t0 < 60:
            for i in range(2):
                if seen[i] is None and mark in read(i):
                    seen[i] = time.monotonic() - t0
            time.sleep(0.002)
        open(done, "w").write("1")
        for a in agents[:2]:
            a.wait(timeout=60)
        if victim_signal == signal.SIGSTOP:
            # From etcd's deletion of the alive key (the lease's end) to each survivor's epoch.
            if not deletes:
                raise RuntimeError("no DELETE of an alive key seen")
            return [x + t0 - deletes[0] if x is not None else None for x in seen]
        return seen
    finally:
        stop_job(agents, etcd, d)


def main():
    before, after = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    mode = sys.argv[4] if len(sys.argv) > 4 else "elastic"
    victim = sys.argv[5] if len(sys.argv) > 5 else "kill"
    if victim not in ("kill", "stop"):
        sys.exit(f"VICTIM: kill or stop, not {victim!r}")
    sig = signal.SIGKILL if victim == "kill" else signal.SIGSTOP
    monitor = sys.argv[6] if len(sys.argv) > 6 else "0.1"
    res = {"before": [], "after": []}
    first = {"before": [], "after": []}  # the survivor that got there first
    for r in range(runs):
        for name, b in (("before", before), ("after", after)):
            s = one(b, f"m{r}{name}{os.getpid()}", mode, sig, monitor)
            res[name].append(max(x if x is not None else float("inf") for x in s))
            first[name].append(min(x if x is not None else float("inf") for x in s))
            print(f"run {r} {name}: survivors at {s[0]:.3f} s and {s[1]:.3f} s", flush=True)
    what = "new epoch" if mode == "elastic" else "failed: lost node"
    if victim == "kill":
        print(f"SIGKILL -> both survivors' {what}, 3 agents over etcd, heartbeat_timeout 5 s "
              f"({mode})")
    else:
        print(f"SIGSTOP; etcd deletes the alive key (lease end) -> both survivors' {what}, "
              f"3 agents over etcd, heartbeat_timeout 2 s, --monitor-interval {monitor} ({mode})")
    print(f"{'':8} {'before':>30} {'after':>30}")
    fmt = lambda v: ", ".join(f"{x:.3f}" for x in v)
    print(f"{'s':8} {fmt(res['before']):>30} {fmt(res['after']):>30}")
    mb, ma = sorted(res["before"])[runs // 2], sorted(res["after"])[runs // 2]
    print(f"median   {mb:.3f} s -> {ma:.3f} s: {mb / ma:.1f}x faster")
    print(f"{'first':8} {fmt(first['before']):>30} {fmt(first['after']):>30}")
    fb, fa = sorted(first["before"])[runs // 2], sorted(first["after"])[runs // 2]
    print(f"median   {fb:.3f} s -> {fa:.3f} s: {fb / fa:.1f}x faster (the first survivor)")


if __name__ == "__main__":
    main()
