"""What scripts/bench.sh and scripts/bench-tls.sh share when they render their results.jsonl: reading the runs,
medians per (load, target), per-round paired ratios and number formatting; and bench-tls.sh's tables
(`bench_report.py tls OUTDIR`)."""
import json
import statistics


class Runs:
    """The runs of one benchmark, grouped by (load, target). A failed run is left out and named in `errors`,
    as is a tap run whose publish-record count differs from what was sent; `checked[load]` counts the tap runs
    whose count was checked as [right, wrong]."""

    def __init__(self, path):
        self.runs = [json.loads(line) for line in open(path) if line.strip()]
        self.loads, self.by, self.errors, self.checked, self.desc = [], {}, [], {}, {}
        for r in self.runs:
            if r["load"] not in self.loads:
                self.loads.append(r["load"])
            run = r["run"]
            if "conns" in run:
                self.desc[r["load"]] = (f'{run["conns"]}×W={run["window"]}, {run["size"]} B, '
                                        f'N={run["sent"] // max(run["conns"], 1)}/conn')
            if "error" in run or run.get("failed_conns"):
                self.errors.append(f'round {r["round"]} {r["load"]} {r["target"]}: {run.get("error", "failed")}')
                continue
            if r["verdicts"] is not None:
                ok = r["verdicts"] == run["sent"]
                self.checked.setdefault(r["load"], [0, 0])[0 if ok else 1] += 1
                if not ok:
                    self.errors.append(f'round {r["round"]} {r["load"]} tap: {r["verdicts"]} publish records for '
                                       f'{run["sent"]} publishes')
            self.by.setdefault((r["load"], r["target"]), []).append(r)
        self.rounds = len({r["round"] for r in self.runs})

    def med(self, load, target, key):
        """Median over rounds of a loadgen field, or of "cpu_per_m" (proxy CPU seconds per million messages)."""
        rs = self.by.get((load, target), [])
        if not rs:
            return None
        if key == "cpu_per_m":
            return statistics.median(x["cpu_s"] / x["run"]["msgs"] * 1e6 for x in rs)
        return statistics.median(x["run"][key] for x in rs)

    def paired(self, load, a, b):
        """Median of the per-round throughput ratios a/b (robust to drift between rounds)."""
        rate = {(x["round"], x["target"]): x["run"]["msgs_per_s"]
                for k, rs in self.by.items() if k[0] == load for x in rs}
        rs = [rate[(r, a)] / rate[(r, b)] for (r, t) in rate if t == a and rate.get((r, b))]
        return statistics.median(rs) if rs else None


def f(v, fmt="{:.0f}"):
    return "–" if v is None else fmt.format(v)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def _diff(a, b):
    return None if a is None or b is None else a - b


def render_tls(outdir):
    """The tables of scripts/bench-tls.sh from outdir's results.jsonl, storm.jsonl and idle.jsonl; written to
    outdir/latest.md and printed. Returns 1 when a run failed or the tap's records did not match, else 0."""
    import os
    R = Runs(os.path.join(outdir, "results.jsonl"))
    T = ("direct", "haproxy", "floor", "tap")
    med = R.med
    wrap_path = os.path.join(outdir, "tap-wrap")
    wrap = open(wrap_path).read().strip() if os.path.exists(wrap_path) else ""
    lines = [f"TLS on both relay legs (client → relay → broker, mTLS and host name checked towards the broker): HAProxy "
             f"{_haproxy_version()} (1 thread), the TLS floor relay (tests/bench/bench_tls_relay.c: OpenSSL on the "
             "sockets and nothing else) and amqptap, alternating with the client speaking TLS to the broker directly. "
             f"Rounds: {R.rounds}, {os.cpu_count()} CPUs. Medians over rounds; 'paired' = median of the per-round "
             "ratios." + (f" The tap ran under `{wrap}` (TAP_BENCH_TAP_WRAP)." if wrap else "") + "\n",
             "| load | direct msg/s | HAProxy msg/s | floor msg/s | tap msg/s | HAProxy/direct | floor/direct "
             "| tap/direct | tap/HAProxy | tap/direct paired | tap/HAProxy paired |",
             "|" + "---|" * 11]
    summary = {}
    for l in R.loads:
        rate = {x: med(l, x, "msgs_per_s") for x in T}
        p50 = {x: med(l, x, "p50_us") for x in T}
        p99 = {x: med(l, x, "p99_us") for x in T}
        cpu = {x: med(l, x, "cpu_per_m") for x in T[1:]}
        peak = {x: _median(r.get("peak_kb") for r in R.by.get((l, x), [])) for x in T[1:]}
        s = summary[l] = dict(rate=rate, p50=p50, p99=p99, cpu=cpu, peak=peak,
                              hd=_ratio(rate["haproxy"], rate["direct"]), td=_ratio(rate["tap"], rate["direct"]),
                              fd=_ratio(rate["floor"], rate["direct"]))
        lines.append(f"| {l} ({R.desc.get(l, '')}) | " + " | ".join(f(rate[x]) for x in T) +
                     f" | {f(s['hd'], '{:.3f}')} | {f(s['fd'], '{:.3f}')} | {f(s['td'], '{:.3f}')} "
                     f"| {f(_ratio(rate['tap'], rate['haproxy']), '{:.3f}')} "
                     f"| {f(R.paired(l, 'tap', 'direct'), '{:.3f}')} | {f(R.paired(l, 'tap', 'haproxy'), '{:.3f}')} |")
    lines += ["", "| load | p50 µs direct / HAProxy / floor / tap | +p50 µs HAProxy / floor / tap "
              "| +p99 µs HAProxy / floor / tap | CPU s per M msgs HAProxy / floor / tap | peak RSS MiB HAProxy / tap "
              "| tap records = sent |",
              "|" + "---|" * 7]
    for l, s in summary.items():
        ok, bad = R.checked.get(l, [0, 0])
        relays = T[1:]
        lines.append(f"| {l} | " + " / ".join(f(s["p50"][x]) for x in T) + " | " +
                     " / ".join(f(_diff(s["p50"][x], s["p50"]["direct"]), "{:+.0f}") for x in relays) + " | " +
                     " / ".join(f(_diff(s["p99"][x], s["p99"]["direct"]), "{:+.0f}") for x in relays) + " | " +
                     " / ".join(f(s["cpu"][x], "{:.2f}") for x in relays) + " "
                     f"| {f(None if s['peak']['haproxy'] is None else s['peak']['haproxy'] / 1024, '{:.1f}')} / "
                     f"{f(None if s['peak']['tap'] is None else s['peak']['tap'] / 1024, '{:.1f}')} "
                     f"| {'yes' if ok and not bad else 'NO'} ({ok}/{ok + bad} runs) |")
    errors = list(R.errors)

    storm_path = os.path.join(outdir, "storm.jsonl")
    storms = [json.loads(x) for x in open(storm_path) if x.strip()] if os.path.exists(storm_path) else []
    storm_sum = {}
    if storms:
        n = storms[0]["run"].get("conns", "?")
        tickets_path = os.path.join(outdir, "broker-tickets")
        tickets = os.path.exists(tickets_path) and open(tickets_path).read().strip() == "1"
        lines += ["", f"Reconnect storm: {n} TLS clients connect at once, each publishes one mandatory message on a "
                  "confirm channel and waits for its ack (tests/bench/bench_storm.c, one thread, non-blocking). "
                  + ("The broker issues TLS 1.3 session tickets (TAP_BENCH_BROKER_TICKETS=1): the relays resume their "
                     "upstream sessions. " if tickets else "The broker issues no TLS 1.3 session tickets (RabbitMQ's "
                     "default): every upstream handshake is a full one. ") +
                  "A bystander, one publisher with one publish in flight connected 1 s before the storm, runs until "
                  "the storm's last client is confirmed: its confirm latencies are what the storm does to traffic "
                  "already flowing. Medians over rounds.\n",
                  "| target | TLS handshakes/s (to the last one) | last handshake ms | p50 / last confirm ms "
                  "| bystander confirm p99 / max ms | relay CPU s | relay peak RSS MiB | failed clients "
                  "| tap records: publish / routed+acked |",
                  "|" + "---|" * 9]
        for t in T:
            rs = [r for r in storms if r["target"] == t]
            good = [r for r in rs if "error" not in r["run"] and not r["run"].get("failed")]
            for r in rs:
                if r not in good:
                    errors.append(f'round {r["round"]} storm {t}: {r["run"].get("error") or r["run"].get("first_error")}')
                if t == "tap" and (r["records"] != r["run"].get("sent") or r["routed_acked"] != r["run"].get("sent")):
                    errors.append(f'round {r["round"]} storm tap: {r["records"]} publish records, {r["routed_acked"]} '
                                  f'routed+acked for {r["run"].get("sent")} publishes')
                by = r.get("bystander")
                if by and ("error" in by or by.get("failed_conns")):
                    errors.append(f'round {r["round"]} storm {t}: the bystander: {by.get("error")}')
                if t == "tap" and by and r.get("bystander_records") != by.get("sent"):
                    errors.append(f'round {r["round"]} storm tap: {r.get("bystander_records")} publish records for '
                                  f'the bystander\'s {by.get("sent")} publishes')
            m = lambda k: _median(r["run"].get(k) for r in good)
            s = storm_sum[t] = dict(hs=m("handshakes_per_s"), hs_last=m("handshake_last_ms"), cf50=m("confirm_p50_ms"),
                                    cf_last=m("confirm_last_ms"), cpu=_median(r["cpu_s"] for r in rs),
                                    by99=_median((r.get("bystander") or {}).get("p99_us") for r in rs),
                                    bymax=_median((r.get("bystander") or {}).get("max_us") for r in rs),
                                    peak=_median(r.get("peak_kb") for r in rs))
            recs = "–" if t != "tap" else ", ".join(f'{r["records"]}/{r["routed_acked"]}' for r in rs)
            relay = t != "direct"
            ms = lambda us: None if us is None else us / 1000
            lines.append(f"| {t} | {f(s['hs'])} | {f(s['hs_last'])} | {f(s['cf50'])} / {f(s['cf_last'])} "
                         f"| {f(ms(s['by99']))} / {f(ms(s['bymax']))} "
                         f"| {f(s['cpu'], '{:.2f}') if relay else '–'} "
                         f"| {f(None if s['peak'] is None else s['peak'] / 1024, '{:.1f}') if relay else '–'} "
                         f"| {sum(r['run'].get('failed', 0) for r in rs)} | {recs} |")

    idle_path = os.path.join(outdir, "idle.jsonl")
    idles = [json.loads(x) for x in open(idle_path) if x.strip()] if os.path.exists(idle_path) else []
    per_conn = {}
    if idles:
        lines += ["", "Memory per idle TLS connection (a fresh relay; RSS before the storm and with every client "
                  "connected, confirmed and idle for 2 s):\n",
                  "| relay | RSS before MiB | RSS with the clients idle MiB | KiB per idle connection (both legs) "
                  "| peak RSS MiB |", "|" + "---|" * 5]
        for r in idles:
            k = (r["rss_idle_kb"] - r["rss0_kb"]) / r["conns"]
            per_conn[r["target"]] = k
            if "error" in r["run"] or r["run"].get("failed"):
                errors.append(f'idle {r["target"]}: {r["run"].get("error") or r["run"].get("first_error")}')
            lines.append(f'| {r["target"]} | {r["rss0_kb"] / 1024:.1f} | {r["rss_idle_kb"] / 1024:.1f} | {k:.1f} '
                         f'| {r["hwm_kb"] / 1024:.1f} |')

    lines += ["", "Targets:"]

    def check(label, ok, detail):
        mark = "n/a" if ok is None else ("PASS" if ok else "FAIL")
        lines.append(f"- {mark}: {label} ({detail})")

    for l, s in summary.items():
        if s["td"] is not None and s["hd"] is not None:
            check(f"{l}: tap/direct at or above HAProxy/direct", s["td"] >= s["hd"],
                  f"{s['td']:.3f} vs {s['hd']:.3f}; the floor relay {f(s['fd'], '{:.3f}')}")
    for l, s in summary.items():
        ct, ch, cf = s["cpu"]["tap"], s["cpu"]["haproxy"], s["cpu"]["floor"]
        if ct is not None and ch is not None:
            check(f"{l}: tap CPU per message at or below HAProxy's", ct <= ch,
                  f"{ct:.2f} vs {ch:.2f} s per M msgs; the floor relay {f(cf, '{:.2f}')}")
    if storm_sum.get("tap") and storm_sum.get("haproxy"):
        a, b = storm_sum["tap"]["cf_last"], storm_sum["haproxy"]["cf_last"]
        check("storm: the last client confirmed through the tap no later than through HAProxy",
              None if None in (a, b) else a <= b, f"{f(a)} vs {f(b)} ms")
    if errors:
        lines += ["", "Problems:"] + [f"- {e}" for e in errors]
    for title, name in (("Tap profile (perf, self time)", "perf-top.txt"), ("by object", "perf-dso.txt")):
        path = os.path.join(outdir, name)
        if os.path.exists(path):
            lines += ["", title + ":", "```"] + [x.rstrip() for x in open(path)] + ["```"]
    text = "\n".join(lines) + "\n"
    open(os.path.join(outdir, "latest.md"), "w").write(text)
    print(text, end="")
    return 1 if errors else 0


def _haproxy_version():
    import subprocess
    try:
        out = subprocess.run(["haproxy", "-v"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=5)
        return out.stdout.decode().split()[2]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "?"


if __name__ == "__main__":
    import sys
    if len(sys.argv) == 3 and sys.argv[1] == "tls":
        sys.exit(render_tls(sys.argv[2]))
    sys.exit("usage: bench_report.py tls OUTDIR")
