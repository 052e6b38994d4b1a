"""The port filter's cost at a round's start: the time ``PortFilter.admit`` adds before the
workers start (filter on: one ``nft -j`` transaction; off: nothing), interleaved, medians and
ratio; and the rules per job as jobs, members and steps grow (they do not).

Needs root and nft. A daemon's restart and rendezvous times with the filter on against off are
not measured here (see the report in bench/README.md)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import statistics
import time

from elasticd.portfilter.guard import PortFilter
from elasticd.portfilter.nft import NftCli
from elasticd.portfilter.rules import Guard, Mode, commands, desired, rule_count

ROUNDS = 40


async def one_round(pf: PortFilter, n: int, members: int) -> float:
    addrs = frozenset(ipaddress.ip_address(0x0A000000 + i + n % 7) for i in range(members))
    t0 = time.perf_counter()
    await pf.admit(Guard("bench", 4242, addrs, frozenset({(ipaddress.ip_address("127.0.0.1"), 29500)})))
    return time.perf_counter() - t0


async def main() -> None:
    nft = NftCli.find()
    assert nft is not None, "needs nft"
    on, off = PortFilter(nft, Mode.ON), PortFilter.disabled("bench")
    await on.start()
    times: dict[str, list[float]] = {"on": [], "off": []}
    for n in range(ROUNDS):  # interleaved: the host's load falls on both alike
        times["on"].append(await one_round(on, n, 64))
        times["off"].append(await one_round(off, n, 64))
    await on.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    rules = {
        f"{jobs} jobs, {members} members": rule_count(
            commands(desired({f"j{j}": Guard(f"j{j}", 1000 + j, frozenset(
                ipaddress.ip_address(0x0A000000 + i) for i in range(members))) for j in range(jobs)}))
        ) // jobs
        for jobs, members in ((1, 2), (1, 1024), (8, 64))
    }  # fmt: skip
    print(json.dumps({"admit_median_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
                      "extra_ms_per_round": round((med["on"] - med["off"]) * 1e3, 3),
                      "rules_per_job": rules}, indent=1))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
