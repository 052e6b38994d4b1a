"""A forked worker shows its own command line and environment (``zygote_program/title.py``): the
block is laid out as exec lays it out, and the kernel then reads it back byte for byte, as
``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ`` of a process exec'd with them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from elasticd.workers.zygote_program import title

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=20)
# A child forked as the zygote forks its workers: it takes a new title, then tells its pid and waits.
CHILD = (
    "import os, sys, json\n"
    "sys.path.insert(0, {root!r})\n"
    "from elasticd.workers.zygote_program.title import look_like\n"
    "argv, env = json.loads(sys.stdin.readline())\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    ok = look_like(argv, env)\n"
    "    print(json.dumps([os.getpid(), ok]), flush=True)\n"
    "    sys.stdin.readline()\n"
    "    os._exit(0)\n"
    "os.waitpid(pid, 0)\n"
)


@given(
    st.lists(TEXT, min_size=1, max_size=5), st.dictionaries(TEXT.filter(lambda k: k and "=" not in k), TEXT)
)
def test_the_block_is_what_exec_lays_out(argv: list[str], env: dict[str, str]) -> None:
    block, env_at = title.exec_block(argv, env)
    assert block[:env_at].split(b"\0")[:-1] == [os.fsencode(a) for a in argv]
    assert block[env_at:].count(b"\0") == len(env) and block.endswith(b"\0")


def test_the_map_is_read_from_proc_stat_whatever_the_command_name() -> None:
    fields = " ".join(str(n) for n in range(4, 53))  # field 3 is the state
    found = title.stat_map(f"12 (a) b (c) R {fields}".encode())
    assert found == {name: number for name, number in title.STAT_FIELDS.items()}


def test_a_forked_child_reads_as_if_exec_d_with_its_own_argv_and_env(tmp_path: Path) -> None:
    import json

    root = str(Path(title.__file__).parents[3])
    argv = [sys.executable, "-u", str(tmp_path / "train.py"), "--lr", "0.1", "a b", ""]
    env = {"RANK": "3", "PATH": "/usr/bin", "EMPTY": "", "SPACE": "x y"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(root=root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps([argv, env]) + "\n")
        proc.stdin.flush()
        pid, ok = json.loads(proc.stdout.readline())
        assert ok, "the kernel refused PR_SET_MM_MAP"
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert cmdline == b"".join(os.fsencode(a) + b"\0" for a in argv)
        assert environ == b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
        found = subprocess.run(["pgrep", "-f", f"{tmp_path}/train.py --lr"], capture_output=True, text=True)
        assert found.stdout.split() == [str(pid)]
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(10)
