"""Rendezvous endpoints from outside: recorded /proc/net/tcp{,6} tables and fd
lists of a real 3-rank ``tcp://`` job (torch 2.13 gloo, tests/data/rendezvous),
command-line URLs and ranks, and the node's numbering rule."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ncclwatch.agent import rendezvous as rdzv
from ncclwatch.agent.discover import RankProcess, _Candidate, _number_by_args, _Seen
from ncclwatch.jobid import UNKNOWN_RANK, UNKNOWN_SOURCE, RankIdentity
from tests.harness import paths

DATA = paths.DATA / "rendezvous"
RECORDED = {int(k): v for k, v in json.loads((DATA / "fds.json").read_text())["pids"].items()}
SERVER, R1, R2 = 10059, 10060, 10061
PORT = 29611


def _proc(tmp: Path, pids=RECORDED) -> str:
    proc = tmp / "proc"
    for pid in pids:
        d = proc / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "net").mkdir()
        (d / "ns").mkdir()
        os.symlink("net:[4026531840]", d / "ns" / "net")
        for i, link in enumerate(RECORDED[pid]):
            os.symlink(link, d / "fd" / str(i))
        for t in ("tcp", "tcp6"):
            (d / "net" / t).write_text((DATA / t).read_text())
    return str(proc)


def test_the_recorded_table_parses_with_addresses() -> None:
    rows = rdzv.parse_table((DATA / "tcp6").read_text())
    listen = [c for c in rows if c.state == "0A" and c.local[1] == PORT]
    assert listen and listen[0].local == ("::", PORT)
    # IPv4-mapped addresses read as IPv4: the same id whichever family dialled.
    assert ("127.0.0.1", PORT) in {c.remote for c in rows}


def test_the_serving_rank_and_its_clients_share_one_endpoint(tmp_path) -> None:
    proc = _proc(tmp_path)
    socks = rdzv.owned(RECORDED, proc)
    found = rdzv.find(socks, {}, RECORDED)
    assert found[SERVER] == rdzv.Endpoint("store", "127.0.0.1", PORT, server=True)
    assert found[R1] == found[R2] == rdzv.Endpoint("store", "127.0.0.1", PORT)
    assert found[SERVER].job_id("n1") == f"store:n1/127.0.0.1:{PORT}"   # loopback: node's own
    # Ray's reading is the same code (one home).
    assert rdzv.store_servers(RECORDED, proc) == {SERVER: PORT}


def test_a_node_without_the_server_takes_the_endpoint_its_members_share(tmp_path) -> None:
    """Ranks 1 and 2 alone (rank 0 on another node): both are connected to the
    store and to rank 0's gloo listener; the store's connection is each one's
    oldest (lowest inode), which breaks the tie."""
    proc = _proc(tmp_path, [R1, R2])
    socks = rdzv.owned([R1, R2], proc)
    assert rdzv.find(socks, {}, [R1, R2])[R1].port == PORT
    # Without torch.distributed's threads, a shared endpoint groups nothing.
    assert rdzv.find(socks, {}, [R1, R2], distributed=[]) == {}
    # One candidate alone shares with no one.
    assert rdzv.find({R1: socks[R1]}, {}, [R1]) == {}


def test_the_url_port_picks_the_connection_and_its_ip(tmp_path) -> None:
    proc = _proc(tmp_path, [R1])
    socks = rdzv.owned([R1], proc)
    url = rdzv.command_line_url(["python", "main.py", "--dist-url", f"tcp://localhost:{PORT}"])
    assert rdzv.find(socks, {R1: url}, [R1])[R1] == rdzv.Endpoint("store", "127.0.0.1", PORT)
    # A URL whose port it holds no connection to: not joined (yet), no member.
    other = rdzv.parse_url("tcp://10.0.0.1:1234")
    assert rdzv.find(socks, {R1: other}, [R1]) == {}


def test_endpoint_ids() -> None:
    assert rdzv.Endpoint("store", "10.0.0.1", 29500).job_id("n1") == "store:10.0.0.1:29500"
    assert rdzv.Endpoint("store", "fd00::1", 29500).job_id("n1") == "store:[fd00::1]:29500"
    assert rdzv.Endpoint("store", "::1", 5).job_id("n1") == "store:n1/[::1]:5"
    assert rdzv.Endpoint("file", path="/shared/r").job_id("n1", shared_path=True) == \
        "file:/shared/r"
    assert rdzv.Endpoint("file", path="/tmp/r").job_id("n1") == "file:n1/tmp/r"


def _conn(local: str, remote: str, inode: int, state: str = "01") -> rdzv.Conn:
    lh, lp = local.rsplit(":", 1)
    rh, rp = remote.rsplit(":", 1)
    return rdzv.Conn((lh, int(lp)), (rh, int(rp)), state, str(inode))


def test_one_job_across_nodes_gets_one_id_on_each() -> None:
    """Rank 0 on node a (10.0.0.1) serves the store on 29500; ranks 1 and 2 on
    node b reach it and rank 0's gloo listener (45000). Each node's agent sees
    only its own processes, and names the same job: the store's IP and port,
    not the node, whatever name the command line dialled."""
    a = {10: [_conn("0.0.0.0:29500", "0.0.0.0:0", 1, "0A"),
              _conn("10.0.0.1:40000", "10.0.0.1:29500", 2),     # its own client
              _conn("10.0.0.1:29500", "10.0.0.1:40000", 3),     # ...accepted
              _conn("10.0.0.1:29500", "10.0.0.2:50001", 4),     # rank 1's
              _conn("10.0.0.1:29500", "10.0.0.2:50002", 5)]}    # rank 2's
    b = {21: [_conn("10.0.0.2:50001", "10.0.0.1:29500", 11),
              _conn("10.0.0.2:50011", "10.0.0.1:45000", 12)],
         22: [_conn("10.0.0.2:50002", "10.0.0.1:29500", 13),
              _conn("10.0.0.2:50012", "10.0.0.1:45000", 14)]}
    on_a = rdzv.find(a, {}, a)
    on_b = rdzv.find(b, {}, b)
    assert on_a[10].server and not on_b[21].server
    ids = {on_a[10].job_id("a"), on_b[21].job_id("b"), on_b[22].job_id("b")}
    assert ids == {"store:10.0.0.1:29500"}
    # The URL by host name picks the store's connection: the same id.
    url = rdzv.parse_url("tcp://node-a.cluster:29500")
    assert rdzv.find({21: b[21]}, {21: url}, [21])[21].job_id("b") == "store:10.0.0.1:29500"


def test_a_file_url_groups_by_its_path_alone() -> None:
    """FileStore holds no fd: the URL on the command line is the whole rule, no
    socket needed; the path is normalised as the URL parser left it."""
    url = rdzv.command_line_url(["python", "t.py", "--init-method", "file:///shared/j/./rdzv"])
    found = rdzv.find({7: []}, {7: url}, [7])
    assert found == {7: rdzv.Endpoint("file", path="/shared/j/rdzv")}
    assert found[7].job_id("n1", shared_path=True) == "file:/shared/j/rdzv"
    assert found[7].job_id("n1") == "file:n1/shared/j/rdzv"


@pytest.mark.parametrize("argv,url", [
    (["python", "t.py", "--init-method=tcp://10.0.0.1:29500"], rdzv.Url("tcp", "10.0.0.1", 29500)),
    (["python", "t.py", "--dist-url", "tcp://h:1"], rdzv.Url("tcp", "h", 1)),
    (["python", "t.py", "--dist_url", "file:///shared/x/../rdzv"], rdzv.Url("file", path="/shared/rdzv")),
    (["python", "t.py", "tcp://10.0.0.2:7"], rdzv.Url("tcp", "10.0.0.2", 7)),    # any argument
    (["python", "t.py", "--init-method", "env://"], None),
    (["python", "t.py", "--init-method", "tcp://h"], None),                      # no port
    (["python", "t.py", "--out", "file://relative"], None),
    (["tcp://10.0.0.2:7"], None),                                                # argv[0] is no option
])
def test_command_line_urls(argv, url) -> None:
    assert rdzv.command_line_url(argv) == url


@pytest.mark.parametrize("argv,got", [
    (["python", "t.py", "--rank", "2", "--world-size", "4"], (2, 4, "args:--rank")),
    (["python", "t.py", "--rank=1", "--world_size=3"], (1, 3, "args:--rank")),
    (["python", "t.py", "--global-rank", "5", "--nranks", "8"], (5, 8, "args:--global-rank")),
    (["python", "t.py", "--rank", "1"], (1, 0, "args:--rank")),
    (["python", "t.py", "--rank", "-1", "--world-size", "3"], None),
    (["python", "t.py", "--rank", "x"], None),
    (["python", "t.py", "--node-rank", "1", "--world-size", "3"], None),   # a node's, not a rank
    (["python", "-c", "spawn_main()", "--multiprocessing-fork"], None),
])
def test_command_line_ranks(argv, got) -> None:
    assert rdzv.args_rank(argv) == got


def test_shared_filesystems_from_mountinfo(tmp_path) -> None:
    d = tmp_path / "proc" / "7"
    d.mkdir(parents=True)
    (d / "mountinfo").write_text(
        "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /shared rw - nfs4 srv:/export rw\n"
        "41 40 0:51 / /shared/local rw - tmpfs tmpfs rw\n"
        "42 22 0:52 / /mnt/jfs rw - fuse.juicefs jfs rw\n")
    proc = str(tmp_path / "proc")
    assert rdzv.shared_path(7, "/shared/job/rdzv", proc)
    assert not rdzv.shared_path(7, "/shared/local/rdzv", proc)
    assert rdzv.shared_path(7, "/mnt/jfs/rdzv", proc)
    assert not rdzv.shared_path(7, "/tmp/rdzv", proc)
    assert not rdzv.shared_path(8, "/shared/rdzv", proc)   # unreadable: node-local


def _member(pid: int, rank: int, argv: list[str], ppid: int = 0) -> tuple[RankProcess, _Seen]:
    ident = RankIdentity("store:10.0.0.1:29500", "store", rank, -1, 0,
                         rdzv.STORE_SOURCE if rank == 0 else UNKNOWN_SOURCE)
    seen = _Seen(1.0, ppid, candidate=_Candidate(argv, {}, args=rdzv.args_rank(argv)))
    return RankProcess(pid, 1.0, ident, {}), seen


def _numbers(members) -> dict[int, tuple[int, str, str]]:
    found = [rp for rp, _ in members]
    seen = {rp.pid: s for rp, s in members}
    return {rp.pid: (rp.identity.rank, rp.identity.rank_source, rp.identity.rank_conflict)
            for rp in _number_by_args(found, seen)}


def _argv(rank: int, world: int = 3) -> list[str]:
    return ["python", "train.py", "--rank", str(rank), "--world-size", str(world)]


def test_ranks_from_argv_when_the_node_corroborates_them() -> None:
    got = _numbers([_member(1, 0, _argv(0)), _member(2, UNKNOWN_RANK, _argv(1)),
                    _member(3, UNKNOWN_RANK, _argv(2))])
    assert got == {1: (0, "tcpstore_server", ""), 2: (1, "args:--rank", ""),
                   3: (2, "args:--rank", "")}


def test_disagreements_leave_members_unnumbered_with_both_shown() -> None:
    # The server says it is rank 2: argv is not the global rank here.
    got = _numbers([_member(1, 0, _argv(2)), _member(2, UNKNOWN_RANK, _argv(1))])
    assert got[1] == (UNKNOWN_RANK, UNKNOWN_SOURCE, "tcpstore_server:0 args:--rank:2")
    assert got[2] == (UNKNOWN_RANK, UNKNOWN_SOURCE, "")
    # Two members claim 1; a third claims 0 while the server is here.
    got = _numbers([_member(1, 0, ["python", "t.py"]), _member(2, UNKNOWN_RANK, _argv(1)),
                    _member(3, UNKNOWN_RANK, _argv(1)), _member(4, UNKNOWN_RANK, _argv(0))])
    assert got[2] == (UNKNOWN_RANK, UNKNOWN_SOURCE, "args:--rank:1 args:1@pid3")
    assert got[4] == (UNKNOWN_RANK, UNKNOWN_SOURCE, "args:--rank:0 tcpstore_server:0@pid1")
    assert got[1] == (0, "tcpstore_server", "")
    # At or past the stated world size, world sizes that differ, or none stated.
    assert _numbers([_member(2, UNKNOWN_RANK, _argv(3))])[2][0] == UNKNOWN_RANK
    assert _numbers([_member(2, UNKNOWN_RANK, _argv(1)), _member(3, UNKNOWN_RANK, _argv(2, 4))]
                    )[2][0] == UNKNOWN_RANK
    assert _numbers([_member(2, UNKNOWN_RANK, ["python", "t.py", "--rank", "1"])]
                    )[2][0] == UNKNOWN_RANK


def test_a_fork_of_a_member_claims_nothing() -> None:
    """A DataLoader worker shares its rank's argv: it is no duplicate claim."""
    got = _numbers([_member(2, UNKNOWN_RANK, _argv(1)), _member(5, UNKNOWN_RANK, _argv(1), ppid=2)])
    assert got[2] == (1, "args:--rank", "")
