"""Permission checks live in one place (elasticd.manager.access, applied by
CommandService.authorize); every command declares its level."""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
from dataclasses import dataclass, replace

import pytest

from elasticd.control.commands import REGISTRY
from elasticd.errors import ConfigError, JobNotFound, PermissionDenied
from elasticd.manager.access import ROOT_ONLY, Access, Admins, Caller, authorize, may_read_job, user_groups
from elasticd.wire import SubmitArgs

ROOT = Caller(0, 0, 1)
OWNER = Caller(1000, 1000, 2)
OTHER = Caller(1001, 1001, 3)

# Adding a command means deciding who may use it: this table must name it.
EXPECTED = {
    "ping": Access.CONNECTED,
    "submit": Access.CONNECTED,
    "status": Access.CONNECTED,
    "nodes": Access.CONNECTED,
    "kill": Access.OWNER,
    "logs": Access.OWNER,
    "drain": Access.OWNER,
    "undrain": Access.OWNER,
    "rm": Access.OWNER,
    "events": Access.HISTORY,
    "check": Access.ADMIN,
}


async def _owners(job: str) -> tuple[int, str] | None:
    if job == "mine":
        return (OWNER.uid, "owner")
    if job == "unreadable":
        return None
    raise JobNotFound(f"no job {job!r}")


def _run(access: Access, caller: Caller, job: str | None) -> None:
    asyncio.run(authorize(access, caller, job, _owners))


def test_every_command_declares_the_expected_access() -> None:
    assert {name: c.access for name, c in REGISTRY.items()} == EXPECTED


@pytest.mark.parametrize("caller", [ROOT, OWNER, OTHER])
def test_connected_commands_are_for_everyone(caller: Caller) -> None:
    _run(Access.CONNECTED, caller, None)
    _run(Access.CONNECTED, caller, "no-such-job")  # no lookup at all


def test_owner_commands_owner_and_root_only() -> None:
    _run(Access.OWNER, OWNER, "mine")
    _run(Access.OWNER, ROOT, "mine")
    with pytest.raises(PermissionDenied, match="belongs to owner"):
        _run(Access.OWNER, OTHER, "mine")


def test_owner_commands_without_a_job_are_root_only() -> None:
    _run(Access.OWNER, ROOT, None)
    for caller in (OWNER, OTHER):
        with pytest.raises(PermissionDenied, match="only root"):
            _run(Access.OWNER, caller, None)


def test_unknown_job_is_not_found_for_everyone_and_unreadable_owner_is_root_only() -> None:
    for caller in (ROOT, OWNER, OTHER):
        with pytest.raises(JobNotFound):
            _run(Access.OWNER, caller, "no-such-job")
    _run(Access.OWNER, ROOT, "unreadable")
    with pytest.raises(PermissionDenied, match="no readable owner"):
        _run(Access.OWNER, OWNER, "unreadable")


def test_root_commands() -> None:
    _run(Access.ROOT, ROOT, None)
    with pytest.raises(PermissionDenied):
        _run(Access.ROOT, OWNER, "mine")


@dataclass(frozen=True)
class _JobArgs:
    job: str | None = None
    node: str = "n"


def test_job_is_read_from_the_job_argument() -> None:
    command = REGISTRY["drain"]
    assert command.job_of(_JobArgs("j1")) == "j1"
    assert command.job_of(_JobArgs(None)) is None


def test_history_all_for_everyone_a_named_job_for_its_owner_and_root() -> None:
    for caller in (ROOT, OWNER, OTHER):
        _run(Access.HISTORY, caller, None)  # filtered per job by the service (may_read_job)
    _run(Access.HISTORY, OWNER, "mine")
    _run(Access.HISTORY, ROOT, "no-such-job")  # a removed job's history: root may read it
    with pytest.raises(PermissionDenied, match="belongs to owner"):
        _run(Access.HISTORY, OTHER, "mine")
    with pytest.raises(JobNotFound):
        _run(Access.HISTORY, OWNER, "no-such-job")


def test_may_read_job_events() -> None:
    assert may_read_job(ROOT, None) and may_read_job(ROOT, (OWNER.uid, "owner"))
    assert may_read_job(OWNER, (OWNER.uid, "owner"))
    assert not may_read_job(OTHER, (OWNER.uid, "owner"))
    assert not may_read_job(OWNER, None)  # a job that is gone: root only


# -- admins: root and admin_group's members, for the limits and --priority --------------------------
ADMIN_GID = 4242
GROUPS = {OWNER.uid: frozenset({1000, ADMIN_GID}), OTHER.uid: frozenset({1001})}
ADMINS = Admins(ADMIN_GID, groups_of=lambda uid: GROUPS.get(uid, frozenset()))


def test_admins_are_root_and_the_admin_groups_members() -> None:
    assert ADMINS(ROOT.uid) and ADMINS(OWNER.uid) and not ADMINS(OTHER.uid)
    assert not ADMINS(31337)  # no name, no groups
    assert ROOT_ONLY(0) and not ROOT_ONLY(OWNER.uid)


def test_admin_group_is_a_name_or_a_number_and_must_exist() -> None:
    assert Admins.of_group(None) == ROOT_ONLY
    assert Admins.of_group("4242").gid == 4242
    assert Admins.of_group(grp.getgrgid(0).gr_name).gid == 0
    with pytest.raises(ConfigError, match="no-such-group-x"):
        Admins.of_group("no-such-group-x")


def test_the_system_group_database_gives_primary_and_supplementary_groups() -> None:
    me = pwd.getpwuid(os.getuid())
    assert me.pw_gid in user_groups(me.pw_uid)
    assert user_groups(2**31 - 7) == frozenset()  # a uid with no name


def test_an_admin_option_is_for_admins_only() -> None:
    for caller in (ROOT, OWNER):
        asyncio.run(authorize(Access.CONNECTED, caller, None, _owners, "--priority", ADMINS))
    with pytest.raises(PermissionDenied, match="only root and members of admin_group may use --priority"):
        asyncio.run(authorize(Access.CONNECTED, OTHER, None, _owners, "--priority", ADMINS))
    with pytest.raises(PermissionDenied, match="only root may use --priority"):
        asyncio.run(authorize(Access.CONNECTED, OWNER, None, _owners, "--priority"))


def test_submit_names_priority_above_zero_as_an_admin_option() -> None:
    submit = REGISTRY["submit"]
    args = SubmitArgs(entry_kind="script", entry="t.py", cwd="/")
    assert submit.admin_option(args) is None
    assert submit.admin_option(replace(args, priority=1)) == "--priority"
    assert all(c.admin_option(None) is None for name, c in REGISTRY.items() if name != "submit")


def test_returning_a_gpu_is_root_only_as_a_node_wide_drain() -> None:
    from elasticd.wire import UndrainArgs

    undrain = REGISTRY["undrain"]
    args = UndrainArgs("n1", gpu="GPU-1")
    assert undrain.job_of(args) is None
    _run(undrain.access, ROOT, undrain.job_of(args))
    for caller in (OWNER, OTHER):
        with pytest.raises(PermissionDenied, match="only root"):
            _run(undrain.access, caller, undrain.job_of(args))


def test_a_job_owner_cannot_return_a_gpu_through_their_job() -> None:
    from elasticd.errors import InvalidArgs
    from elasticd.wire import UndrainArgs

    undrain = REGISTRY["undrain"]
    args = UndrainArgs("n1", job="mine", gpu="GPU-1")
    _run(undrain.access, OWNER, undrain.job_of(args))  # the owner passes for their job...
    with pytest.raises(InvalidArgs, match="not both"):  # ...and the command refuses the pair
        asyncio.run(undrain.handler(None, args, OWNER))  # type: ignore[arg-type]


def test_an_admin_command_is_for_root_and_admins_only() -> None:
    for caller in (ROOT, OWNER):
        asyncio.run(authorize(Access.ADMIN, caller, None, _owners, None, ADMINS))
    with pytest.raises(PermissionDenied, match="only root and members of admin_group may do this"):
        asyncio.run(authorize(Access.ADMIN, OTHER, None, _owners, None, ADMINS))
    with pytest.raises(PermissionDenied, match="only root may do this"):
        asyncio.run(authorize(Access.ADMIN, OWNER, None, _owners))
