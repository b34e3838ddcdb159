#!/usr/bin/env python3
"""Final test accuracy of variants of one config over seeds, as a markdown table (the tables of
docs/results.md "What every FL framework ships"): the server optimizers and FedProx at two
label skews, dense and sharded (`optimizers`, SCAFFOLD and FedAvg on the unsharded model
among them), FedAdam's and FedYogi's server rate on a grid (`eta`), or every aggregator against
a share of attackers of each kind (`robust`).

Each variant is the config's TOML text with sections appended or lines replaced, run by the
release binary (`fedshard run CONFIG --seed S --out DIR --quiet --metrics-addr off`); the final
accuracy is read from DIR/summary.json. Needs `cargo build --release` and python3 (standard
library only). Usage:

    scripts/baselines_grid.py optimizers config/digits-cnn.toml [--seeds 3] [--rounds 40]
    scripts/baselines_grid.py robust config/digits-cnn.toml [--seeds 3] [--rounds 40]
    scripts/baselines_grid.py eta config/digits-cnn.toml [--only ROW,ROW] ...

Prints one line per run as it ends, then the table: mean ± sample std over the seeds and the
95% Student-t interval of the mean.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("FEDSHARD", "target/release/fedshard")
# Two-sided 95% Student-t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}

OPTIMIZERS = {
    "fedavg": "",
    "fedavgm": '\n[server_optimizer]\nkind = "momentum"\nlr = 1.0\nmomentum = 0.5\n',
    "fedadam": '\n[server_optimizer]\nkind = "adam"\nlr = 0.01\n',
    "fedyogi": '\n[server_optimizer]\nkind = "yogi"\nlr = 0.01\n',
    "fedprox": "proximal_mu = 0.01",
    # SCAFFOLD trains the whole dense model: its dense column drops the sharded layers (the
    # other arms' dense column trains full-rank factors), its sharded column is refused; FedAvg
    # on the same unsharded model is its baseline.
    "fedavg-unsharded": "unsharded",
    "scaffold": "scaffold = true",
}

# 10 clients a round: Krum keeps n − f of them and tolerates f = 3 (n ≥ 2f + 3); Bulyan needs
# n ≥ 4f + 3, so f = 1; the trimmed mean cuts 30% from each end.
ROBUST = {
    "fedavg": '"fedavg"',
    "median": '"median"',
    "trimmed-mean": '{ kind = "trimmed-mean", beta = 0.3 }',
    "krum": '{ kind = "krum", f = 3, m = 7 }',
    "bulyan": '{ kind = "bulyan", f = 1 }',
}
AGGREGATORS = list(ROBUST)
# Each kind with its parameter (docs/async.md, "Byzantine clients").
ATTACKS = {
    "sign-flip": "",
    "scale": "factor = -4.0\n",
    "gaussian": "sigma = 1.0\n",
    "constant": "value = 0.0\n",
    "label-flip": "",
}
SHARES = [0.0, 0.1, 0.2, 0.3]


def set_line(text, key, value):
    """Replaces `key = ...` (first occurrence) or fails loudly."""
    new, n = re.subn(rf"(?m)^{re.escape(key)} = .*$", f"{key} = {value}", text, count=1)
    if n != 1:
        sys.exit(f"the config has no `{key} = ` line to replace")
    return new


def optimizer_variants(text):
    for alpha in ["0.1", "1.0"]:
        for dense in [True, False]:
            base = set_line(text, "alpha", alpha)
            if dense:
                base = set_line(base, "keep_ratios", "[{ ratio = 1.0, share = 1.0 }]")
            for name, extra in OPTIMIZERS.items():
                if extra.startswith("proximal_mu"):
                    variant = base.replace("[training]\n", f"[training]\n{extra}\n", 1)
                elif extra.startswith("scaffold"):
                    variant = base.replace("[federation]\n", f"[federation]\n{extra}\n", 1)
                    if dense:
                        variant = re.sub(r"(?m)^sharded_layers = .*$", "", variant)
                elif extra == "unsharded":
                    if not dense:
                        continue  # a keep ratio below 1 needs sharded layers
                    variant = re.sub(r"(?m)^sharded_layers = .*$", "", base)
                else:
                    variant = base + extra
                column = f"α = {alpha}, {'dense' if dense else 'sharded'}"
                yield name, column, variant


def eta_variants(text):
    """FedAdam's and FedYogi's server rate η on a grid (Reddi et al. tune it per task), dense
    clients, at both skews."""
    for alpha in ["0.1", "1.0"]:
        base = set_line(set_line(text, "alpha", alpha), "keep_ratios", "[{ ratio = 1.0, share = 1.0 }]")
        for kind in ["adam", "yogi"]:
            for lr in ["0.001", "0.003", "0.01", "0.03", "0.1"]:
                variant = base + f'\n[server_optimizer]\nkind = "{kind}"\nlr = {lr}\n'
                yield f"fed{kind} η = {lr}", f"α = {alpha}, dense", variant


def robust_variants(text):
    for aggregator in AGGREGATORS:
        for kind in ATTACKS:
            for share in SHARES:
                variant = set_line(text, "aggregator", ROBUST[aggregator])
                if share > 0:
                    variant += (
                        f'\n[faults.byzantine]\nshare = {share}\nkind = "{kind}"\n{ATTACKS[kind]}'
                    )
                elif kind != "sign-flip":
                    continue  # one attack-free column per aggregator
                column = "no attack" if share == 0 else f"{kind} {int(share * 100)}%"
                yield aggregator, column, variant


def run(text, seed, rounds, work):
    text = set_line(text, "rounds", str(rounds))
    path = os.path.join(work, f"c{time.monotonic_ns()}.toml")
    with open(path, "w") as f:
        f.write(text)
    out = path[:-5]
    cmd = [BIN, "run", path, "--seed", str(seed), "--out", out, "--quiet", "--metrics-addr", "off"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return None, done.stderr.strip().splitlines()[-1:] or ["failed"]
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["final_accuracy"], None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("grid", choices=["optimizers", "robust", "eta"])
    parser.add_argument("config")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--only", help="comma-separated rows to run (default: all)")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    text = open(args.config).read()
    variants = {"optimizers": optimizer_variants, "robust": robust_variants, "eta": eta_variants}[
        args.grid
    ](text)
    results, rows, columns = {}, [], []
    with tempfile.TemporaryDirectory() as work:
        for row, column, variant in variants:
            if only is not None and row not in only:
                continue
            rows += [row] if row not in rows else []
            columns += [column] if column not in columns else []
            for seed in range(1, args.seeds + 1):
                started = time.time()
                accuracy, error = run(variant, seed, args.rounds, work)
                results.setdefault((row, column), []).append(accuracy)
                shown = f"{100 * accuracy:.1f}%" if accuracy is not None else f"failed: {error}"
                print(f"{row} | {column} | seed {seed}: {shown} ({time.time() - started:.1f} s)",
                      flush=True)
    print(f"\nFinal test accuracy in % on {args.config}, {args.rounds} rounds, seeds 1–{args.seeds}:"
          " mean ± std [95% interval]\n")
    print("| | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for row in rows:
        cells = []
        for column in columns:
            values = [100 * a for a in results.get((row, column), []) if a is not None]
            if not values:
                cells.append("—")
                continue
            mean = statistics.mean(values)
            if len(values) < 2:
                cells.append(f"{mean:.1f}")
                continue
            std = statistics.stdev(values)
            half = T95.get(len(values) - 1, 1.96) * std / len(values) ** 0.5
            cells.append(f"{mean:.1f} ± {std:.1f} [{mean - half:.0f}, {mean + half:.0f}]")
        print(f"| {row} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
