"""Reference values for fedshard's privacy accountant (strategies/src/privacy/tests.rs).

Run with Google's dp-accounting 0.6.0:
    /work/torchref/bin/pip install dp-accounting==0.6.0
    /work/torchref/bin/python scripts/dp_reference.py
Each line names the exact call; the Rust tests hard-code the printed numbers.
"""
import dp_accounting
from dp_accounting import rdp as rdp_lib
from dp_accounting.rdp import rdp_privacy_accountant as r
from dp_accounting import pld

NR = dp_accounting.NeighboringRelation


def poisson(q, sigma, steps, delta):
    acc = rdp_lib.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    eps = acc.get_epsilon(delta)
    p = pld.PLDAccountant()
    p.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    print(f"poisson q={q} sigma={sigma} steps={steps} delta={delta}: rdp eps={eps!r} pld eps={p.get_epsilon(delta)!r}")


def wor(n, m, sigma, steps, delta):
    acc = rdp_lib.RdpAccountant(neighboring_relation=NR.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, m, dp_accounting.GaussianDpEvent(sigma)), steps)
    print(f"wor n={n} m={m} sigma={sigma} steps={steps} delta={delta}: rdp eps={acc.get_epsilon(delta)!r}")


def gaussian(sigma, steps, delta):
    acc = rdp_lib.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(sigma), steps)
    print(f"gaussian sigma={sigma} steps={steps} delta={delta}: rdp eps={acc.get_epsilon(delta)!r}")


for q, s in [(0.01, 1.1), (0.1, 1.0)]:
    for a in [2.0, 2.5, 8.0, 12.0, 32.0]:
        print(f"_compute_rdp_poisson_subsampled_gaussian(q={q}, noise_multiplier={s}, orders=[{a}]) = {r._compute_rdp_poisson_subsampled_gaussian(q, s, [a])[0]!r}")
for q, s in [(0.05, 0.7), (0.2, 2.0)]:
    for a in [2.0, 3.5, 16.0, 300.0]:
        print(f"_compute_rdp_sample_wor_gaussian(q={q}, noise_multiplier={s}, orders=[{a}]) = {r._compute_rdp_sample_wor_gaussian(q, s, [a])[0]!r}")

poisson(0.01, 1.1, 1000, 1e-5)
poisson(0.1, 1.0, 30, 1e-5)
poisson(0.5, 1.5, 40, 1e-4)
poisson(256 / 60000, 1.1, 60 * 60000 // 256, 1e-5)
wor(1000, 100, 1.0, 30, 1e-5)
wor(1000, 200, 0.5, 40, 1e-4)
wor(60000, 256, 0.55, 10000, 1e-5)
gaussian(5.0, 20, 1e-5)
