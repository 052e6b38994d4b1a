"""Whether a round's ranks use a store hosted for them (``TORCHELASTIC_USE_AGENT_STORE``): pure.

torchrun's agent hosts the rendezvous ``TCPStore`` and tells its workers so
(``TORCHELASTIC_USE_AGENT_STORE=True``): every rank, rank 0 too, is a client of it. elasticd's
host is the job's store host (``workers.warm.storehost``), forked from its warm parent on the node
that offers it. It is bound before any rank is forked, so no rank reaches ``MASTER_PORT`` before
something listens there (torch's client backs off 0.4-0.6 s when it does), and it outlives the
ranks' restarts.

Every node of a round must agree: with ``True`` the ranks are clients only, with ``False`` rank
0 hosts the store itself. So a node commits when it joins (``Join.store``: a store host already
listens on the port it offers), the round's head carries group rank 0's choice to every member
(``RoundHead.agent_store``), and each node's workers get that value. A join never waits for the
zygote's imports (the round's join timeout runs meanwhile): a node whose zygote is not ready yet,
or that has none (cold workers), or whose store host cannot start, offers a plain port, and the
round is rank 0-hosted, as it always could be. A round of one node needs no agreement: it
decides at the start, when the zygote is ready (the start waits for it anyway).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"  # where a job of one node for its whole life serves its store


@dataclass(frozen=True)
class Offer:
    """What a node puts in its join: the port for ``MASTER_PORT`` should it lead, and whether its
    store host listens there."""

    port: int
    store: bool
    check_port: int = 0  # with --node-check: this node's check server (0: none)
    compute: float | None = None  # and the compute figure it measured


@dataclass(frozen=True)
class Choice:
    """A decision and why (the reason is logged)."""

    agent_store: bool
    why: str


def store_address(node_address: str, max_nodes: int) -> str:
    """Where the job's store host listens on this node, and the ``MASTER_ADDR`` its ranks are
    told: loopback for a job whose spec allows one node at most (``--nnodes 1``, ``--standalone``),
    which no other host ever needs to reach, for its whole life, as torchrun's ``--standalone``
    tells its ranks a loopback address; the node's workers' address (``address``) for a job that
    may span nodes, whose store the other members reach there (it stays there while the job runs
    on one node: the store would otherwise move when a second node joins)."""
    if max_nodes > 1:
        return node_address
    try:
        return node_address if ipaddress.ip_address(node_address).is_loopback else LOOPBACK
    except ValueError:  # a name ("localhost" too): its loopback is this one
        return LOOPBACK


def at_join(no_warm_parent: str | None, host_failed: str | None) -> Choice:
    """Whether this node offers a store host in its join (without one, a round it leads is rank
    0-hosted, unless it is a round of this node alone: ``at_start``). ``no_warm_parent``: why the
    job has no usable zygote here now (None: it has one); ``host_failed``: why its store host could
    not start."""
    if no_warm_parent is not None:
        return Choice(False, f"no store host to offer: {no_warm_parent}")
    if host_failed is not None:
        return Choice(False, f"no store host to offer: it cannot start ({host_failed})")
    return Choice(True, "a store host of the job listens on the port offered")


def at_start(advertised: bool, leads: bool, one_node: bool, serving: str | None) -> Choice:
    """What this node's workers are told. ``advertised``: the round's head (group rank 0's join);
    ``leads``: this node is group rank 0; ``one_node``: every rank of the round is here;
    ``serving``: why this node's store host cannot serve the round (None: it can), asked of the
    leader of a round that advertised one, and of a round of one node.

    A round of one node decides alone, at the start: a store host if one serves (started then if
    its join came before the zygote was ready), else rank 0. A round of several nodes follows its
    head; only the leader can find its store host gone (killed, or with its zygote) between its
    join and the start. It then starts another on the same port (the ranks' clients retry until
    one listens). Only if that fails too is ``serving`` said here: the members were told ``True``
    already, so the ranks find no store. That is logged as an error; they wait for one until
    their own timeout (``init_process_group``'s, or the job's hang timeout), and the next round's
    joins offer a store host only if one listens."""
    if one_node:
        if serving is None:
            return Choice(True, "every rank is a client of the job's store host")
        return Choice(False, f"no store host ({serving}): rank 0 hosts the store")
    if not advertised:
        return Choice(False, "the round's leader offered no store host: rank 0 hosts the store")
    if not leads or serving is None:
        return Choice(True, "every rank is a client of the store host on the master's node")
    return Choice(True, f"the store host cannot serve ({serving}): the ranks will find no store")


def offered_again(alive: bool, served_peers: bool) -> bool:
    """Whether a node's store host may be offered in its next join. One that served a round of
    several nodes may not: that round's ranks on another node may still run (cut off, or not
    stopped yet) and would write into the next round's keys after the host was emptied, its
    barrier counts among them. A new host, on a port they never knew, serves the next round. A
    round of one node stops its own ranks before the next starts, so its host serves them all."""
    return alive and not served_peers


def named_port_refusal(
    named: int | None, leads: bool, chosen: Choice, serving: str | None, listen: str | None
) -> str | None:
    """Why a round cannot start with the port its user named (torchrun's ``--master-port``:
    ``named``; None: none was named, elasticd picks one and nothing is refused), or None.

    A script may reach the store on that port itself (``init_method="tcp://host:PORT"``), so
    under torchrun's contract something must listen there: the job's store host on group rank 0's
    node (``chosen.agent_store``), or rank 0 itself. If neither can, the ranks would wait for a
    store until their own timeout: the job is refused at once instead, saying why. Only group rank
    0's node can tell (``leads``); ``serving``: why its store host cannot serve (None: it can);
    ``listen``: why rank 0 could not listen on the port now (None: it could), asked only when
    rank 0 is to host the store."""
    if named is None or not leads:
        return None
    if chosen.agent_store:
        return None if serving is None else f"--master-port {named} has no store host: {serving}"
    if listen is not None:
        return f"--master-port {named} cannot be listened on: {listen}"
    return None
