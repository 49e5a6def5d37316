"""What scripts/bench.sh and scripts/bench-tls.sh share when they render their results.jsonl: reading the runs,
medians per (load, target), per-round paired ratios and number formatting."""
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
