#!/usr/bin/env python3
"""Issue 14 / peer check: time from SIGKILL of one of three `weft run` agents (and its
workers) over etcd to the survivors' new epoch (elastic, --nnodes 2:3 --max-restarts 1) or
to their `failed: lost node` (fixed --nnodes 3), for two weft binaries side by side.

usage: python3 bench/elastic/etcd_loss_detection.py BEFORE_WEFT AFTER_WEFT [RUNS] [MODE]
  (two weft binaries; the same binary twice measures one build; needs /usr/bin/etcd)
  MODE: elastic (default) or fixed. Default --rdzv-conf (heartbeat_timeout 5 s) otherwise.
"""
import os, shutil, signal, socket, subprocess, sys, tempfile, time


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


def one(weft, run_id, mode):
    d = tempfile.mkdtemp(prefix="weft_peercheck_")
    etcd, ep = start_etcd(d)
    env = dict(os.environ, WEFT_JOB_TOKEN="peercheck-measure")
    done = f"{d}/done"
    worker = (f"echo world $GROUP_WORLD_SIZE epoch $WEFT_RDZV_EPOCH; while [ ! -f {done} ] || "
              f"[ $WEFT_RDZV_EPOCH != 2 ]; do sleep 0.05; done")
    nn = ["--nnodes", "2:3", "--max-restarts", "1"] if mode == "elastic" else ["--nnodes", "3"]
    args = [weft, "run", *nn, "--nproc-per-node", "1", "--rdzv-backend", "etcd",
            "--rdzv-endpoint", ep, "--rdzv-id", run_id, "--rdzv-conf", "last_call_timeout=30",
            "--", "sh", "-c", worker]
    logs = [f"{d}/{i}.log" for i in range(3)]
    agents = [subprocess.Popen(args, env=env, stdout=open(l, "w"), stderr=subprocess.STDOUT)
              for l in logs]
    read = lambda i: open(logs[i]).read()
    try:
        t = time.time()
        while not all("world 3 epoch 1" in read(i) for i in range(3)):
            if time.time() - t > 60:
                raise RuntimeError("no epoch 1: " + read(0))
            time.sleep(0.02)
        time.sleep(0.5)
        victim = agents[2]
        kids = children(victim.pid)
        t0 = time.monotonic()
        victim.send_signal(signal.SIGKILL)
        for k in kids:
            os.kill(k, signal.SIGKILL)
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
        return seen
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                for k in children(a.pid):
                    os.kill(k, signal.SIGKILL)
                a.wait()
        etcd.kill()
        etcd.wait()
        shutil.rmtree(d, ignore_errors=True)


def main():
    before, after = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    mode = sys.argv[4] if len(sys.argv) > 4 else "elastic"
    res = {"before": [], "after": []}
    for r in range(runs):
        for name, b in (("before", before), ("after", after)):
            s = one(b, f"m{r}{name}{os.getpid()}", mode)
            res[name].append(max(x if x is not None else float("inf") for x in s))
            print(f"run {r} {name}: survivors at {s[0]:.3f} s and {s[1]:.3f} s", flush=True)
    what = "new epoch" if mode == "elastic" else "failed: lost node"
    print(f"SIGKILL -> both survivors' {what}, 3 agents over etcd, heartbeat_timeout 5 s ({mode})")
    print(f"{'':8} {'before':>30} {'after':>30}")
    fmt = lambda v: ", ".join(f"{x:.3f}" for x in v)
    print(f"{'s':8} {fmt(res['before']):>30} {fmt(res['after']):>30}")
    mb, ma = sorted(res["before"])[runs // 2], sorted(res["after"])[runs // 2]
    print(f"median   {mb:.3f} s -> {ma:.3f} s: {mb / ma:.1f}x faster")


if __name__ == "__main__":
    main()
