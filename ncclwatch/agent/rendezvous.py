"""A torch process's rendezvous endpoint, read from outside the process.

A job started by a hand-rolled launcher (a shell loop, ``ssh host python
train.py --rank $i``) has no launcher and no rank variables: its ranks call
``init_process_group(init_method="tcp://host:port" | "file:///path", rank=i,
world_size=n)``. What the outside shows of that:

- the c10d TCPStore: rank 0 serves it (listens on the port and is itself
  connected to it), every other rank holds one connection to the same
  host:port. On a node without the server, the store is the remote endpoint
  most of the node's candidates share (gloo/NCCL mesh connections go to a
  different port per peer);
- the URL on the process's own command line (``URL_OPTIONS``, or any
  argument that is a ``tcp://`` / ``file://`` URL): it says which port is
  the store's; a ``file://`` rendezvous is known by the URL alone (torch
  2.13's FileStore opens the file per operation and holds no fd).

The job id names the endpoint as the connection shows it (the IP, not a name
from the command line), so it is the same on every node: ``store:<ip>:<port>``
(loopback: scoped by node, as ``jobid._master`` does), ``file:<path>`` (a
path on a local filesystem: scoped by node). A tcp:// URL with no connection
to its port joins nothing: a parent that only passes the URL on to its
spawn children (PyTorch's ImageNet example) is no member.

Also here, one home for the socket reading Ray's case uses
(``socket_inodes``, ``connections``, ``store_servers``).
"""

from __future__ import annotations

import ipaddress
import os
import struct
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

#: job_source of a job grouped by its TCPStore, and by its FileStore path.
STORE_JOB_SOURCE = "store"
FILE_JOB_SOURCE = "file"
#: rank_source of the process serving a tcp:// rendezvous's TCPStore (rank 0).
STORE_SOURCE = "tcpstore_server"
#: rank_source prefix of a number taken from the process's own argv.
ARGS_SOURCE = "args"

#: Options whose value is the rendezvous URL (``--opt URL`` or ``--opt=URL``).
URL_OPTIONS = ("--init-method", "--init_method", "--dist-url", "--dist_url",
               "--dist-init-method", "--dist_init_method", "--rendezvous", "--rdzv-url")
#: Options whose value is the process's global rank / the job's world size.
RANK_OPTIONS = ("--rank", "--global-rank", "--global_rank", "--world-rank", "--world_rank",
                "--process-id", "--process_id")
WORLD_OPTIONS = ("--world-size", "--world_size", "--worldsize", "--nranks", "--n-ranks",
                 "--num-ranks", "--num_ranks", "--num-processes", "--num_processes")
URL_SCHEMES = ("tcp", "file")
#: Filesystems a file:// rendezvous can span nodes on (mountinfo fstype, or
#: its prefix before a dot: ``fuse.*``); any other path is node-local.
SHARED_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph",
                      "cephfs", "glusterfs", "9p", "virtiofs", "fuse", "wekafs", "panfs",
                      "orangefs", "ocfs2", "gfs2")

#: Thread names (/proc/PID/task/*/comm) of torch.distributed's own threads:
#: a process sharing a remote endpoint with others is grouped by it only when
#: it shows one (two torch notebooks talking to one web service are no job).
C10D_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop", "pt_nccl_watchdg", "pt_nccl_heartbt",
                "pt_tcpstore_uv")
#: Threads of one process looked at for those names.
MAX_THREADS = 512

_LISTEN, _ESTABLISHED = "0A", "01"
#: Bytes of a process's command line looked at for a URL or a rank.
MAX_ARGS = 64


@dataclass(frozen=True, slots=True)
class Conn:
    """One TCP socket of /proc/PID/net/tcp{,6}: addresses as (ip, port)."""

    local: tuple[str, int]
    remote: tuple[str, int]
    state: str
    inode: str


@dataclass(frozen=True, slots=True)
class Url:
    scheme: str     # "tcp" or "file"
    host: str = ""
    port: int = 0
    path: str = ""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What a member was grouped by: a TCPStore (host, port) or a FileStore path."""

    source: str           # STORE_JOB_SOURCE or FILE_JOB_SOURCE
    host: str = ""
    port: int = 0
    path: str = ""
    server: bool = False  # this process serves the store (rank 0)

    def job_id(self, node: str, shared_path: bool = False) -> str:
        if self.source == FILE_JOB_SOURCE:
            return f"file:{self.path}" if shared_path else f"file:{node}{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        scope = f"{node}/" if _loopback(self.host) else ""
        return f"store:{scope}{host}:{self.port}"


# --- the command line -------------------------------------------------------

def _option_values(cmdline: Sequence[str], names: Iterable[str]) -> list[str]:
    names = tuple(names)
    args = list(cmdline[1:MAX_ARGS])
    out = []
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name in names:
            if eq:
                out.append(value)
            elif i + 1 < len(args):
                out.append(args[i + 1])
    return out


def parse_url(text: str) -> Url | None:
    """A ``tcp://host:port`` or ``file:///path`` rendezvous URL, else None."""
    try:
        u = urlsplit(text.strip())
        if u.scheme == "tcp" and u.hostname and u.port:
            return Url("tcp", host=u.hostname, port=u.port)
    except ValueError:
        return None
    if u.scheme == "file" and u.path.startswith("/"):
        return Url("file", path=os.path.normpath(u.path))
    return None


def command_line_url(cmdline: Sequence[str]) -> Url | None:
    """The rendezvous URL the process's own argv names (an option of
    URL_OPTIONS, else any argument that is such a URL)."""
    for value in _option_values(cmdline, URL_OPTIONS):
        if (url := parse_url(value)) is not None:
            return url
    for a in cmdline[1:MAX_ARGS]:
        if a.startswith(tuple(f"{s}://" for s in URL_SCHEMES)):
            if (url := parse_url(a)) is not None:
                return url
    return None


def _number(cmdline: Sequence[str], names: Iterable[str]) -> tuple[int, str] | None:
    for name in names:
        for value in _option_values(cmdline, (name,)):
            v = value.strip()
            if v.isascii() and v.isdigit() and len(v) < 8:
                return int(v), name
    return None


def args_rank(cmdline: Sequence[str]) -> tuple[int, int, str] | None:
    """(rank, world size or 0, rank_source) the process's own argv states, else None."""
    rank = _number(cmdline, RANK_OPTIONS)
    if rank is None:
        return None
    world = _number(cmdline, WORLD_OPTIONS)
    return rank[0], world[0] if world else 0, f"{ARGS_SOURCE}:{rank[1]}"


# --- sockets ----------------------------------------------------------------

def socket_inodes(pid: int, proc: str = "/proc") -> set[str]:
    """Inodes of the sockets the pid holds (one /proc/PID/fd walk)."""
    base = f"{proc}/{pid}/fd"
    out = set()
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        try:
            link = os.readlink(f"{base}/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def _ip(hexaddr: str) -> str:
    """An address of /proc/net/tcp{,6} (32-bit words in host order); an
    IPv4-mapped IPv6 address as IPv4."""
    raw = bytes.fromhex(hexaddr)
    words = b"".join(struct.pack("=I", int.from_bytes(raw[i:i + 4], "big"))
                     for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def parse_table(text: str) -> list[Conn]:
    rows = []
    for line in text.splitlines()[1:]:
        p = line.split()
        if len(p) < 10:
            continue
        try:
            la, lp = p[1].rsplit(":", 1)
            ra, rp = p[2].rsplit(":", 1)
            rows.append(Conn((_ip(la), int(lp, 16)), (_ip(ra), int(rp, 16)), p[3], p[9]))
        except ValueError:
            continue
    return rows


def connections(pid: int, proc: str = "/proc") -> list[Conn]:
    """The TCP sockets of the pid's network namespace (every process's)."""
    rows: list[Conn] = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/{pid}/net/{name}") as f:
                rows.extend(parse_table(f.read()))
        except OSError:
            continue
    return rows


def netns(pid: int, proc: str = "/proc") -> str:
    try:
        return os.readlink(f"{proc}/{pid}/ns/net")
    except OSError:
        return f"pid:{pid}"


def owned(pids: Iterable[int], proc: str = "/proc",
          inodes: Mapping[int, set[str]] | None = None) -> dict[int, list[Conn]]:
    """{pid: its TCP sockets}: one table read per network namespace, one fd
    walk per pid (``inodes`` given: no walk)."""
    out: dict[int, list[Conn]] = {}
    tables: dict[str, list[Conn]] = {}
    for pid in pids:
        mine = inodes[pid] if inodes is not None and pid in inodes else socket_inodes(pid, proc)
        if not mine:
            out[pid] = []
            continue
        ns = netns(pid, proc)
        if ns not in tables:
            tables[ns] = connections(pid, proc)
        out[pid] = [c for c in tables[ns] if c.inode in mine]
    return out


def _server_port(mine: list[Conn]) -> tuple[str, int] | None:
    """The store endpoint (as dialled) a process serves: it listens on the
    port, holds a connection to that port and the accepted end of it, and
    at least one other accepted connection (another rank)."""
    listening = {c.local[1] for c in mine if c.state == _LISTEN}
    est = [c for c in mine if c.state == _ESTABLISHED]
    for c in est:
        port = c.remote[1]
        if port not in listening or c.local[1] in listening:
            continue
        accepted = [a for a in est if a.local[1] == port]
        if any(a.remote == c.local for a in accepted) and len(accepted) >= 2:
            return c.remote
    return None


def _outgoing(mine: list[Conn]) -> list[Conn]:
    listening = {c.local[1] for c in mine if c.state == _LISTEN}
    return [c for c in mine if c.state == _ESTABLISHED and c.local[1] not in listening]


def c10d_threads(pid: int, proc: str = "/proc") -> bool:
    """The process runs a thread of torch.distributed's (C10D_THREADS)."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")[:MAX_THREADS]
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/comm") as f:
                if f.read().strip() in C10D_THREADS:
                    return True
        except OSError:
            continue
    return False


def find(socks: Mapping[int, list[Conn]], urls: Mapping[int, Url | None],
         due: Iterable[int], distributed: Iterable[int] | None = None) -> dict[int, Endpoint]:
    """The endpoints of the ``due`` candidates, from every candidate's sockets
    (``socks``: fresh for the due ones, the last reading for the others) and
    their command-line URLs. Only ``distributed`` candidates (showing
    C10D_THREADS; None: all) count for the shared-endpoint rule. A candidate
    none of the rules places is left out."""
    dist = set(socks) if distributed is None else set(distributed)
    out: dict[int, Endpoint] = {}
    servers = {pid: ep for pid, mine in socks.items() if (ep := _server_port(mine))}
    served = {ep[1]: ep for ep in servers.values()}
    # Remote endpoint -> candidates connected to it, and each one's oldest
    # (lowest socket inode: the TCPStore connection is made before the mesh's).
    sharing: dict[tuple[str, int], set[int]] = {}
    for pid, mine in socks.items():
        if pid in servers or pid not in dist:
            continue
        for c in _outgoing(mine):
            sharing.setdefault(c.remote, set()).add(pid)
    for pid in due:
        url = urls.get(pid)
        if url is not None and url.scheme == "file":
            out[pid] = Endpoint(FILE_JOB_SOURCE, path=url.path)
            continue
        if pid in servers:
            host, port = servers[pid]
            if url is None or url.port == port:
                out[pid] = Endpoint(STORE_JOB_SOURCE, host, port, server=True)
            continue
        mine = _outgoing(socks.get(pid, []))
        ep = None
        if url is not None:
            ep = next((c.remote for c in mine if c.remote[1] == url.port), None)
        else:
            ep = next((served[c.remote[1]] for c in mine if c.remote[1] in served
                       and _same_host(c.remote[0], served[c.remote[1]][0])), None) \
                or (_shared(pid, mine, sharing, socks) if pid in dist else None)
        if ep is not None:
            out[pid] = Endpoint(STORE_JOB_SOURCE, ep[0], ep[1])
    return out


def _shared(pid: int, mine: list[Conn], sharing: Mapping[tuple[str, int], set[int]],
            socks: Mapping[int, list[Conn]]) -> tuple[str, int] | None:
    """The remote endpoint most candidates (two or more) share with ``pid``;
    a tie goes to the endpoint that is most of its sharers' oldest
    connection, else to none (a wrong group is worse than none)."""
    mine_eps = {c.remote for c in mine}
    counts = {ep: len(sharing.get(ep, ())) for ep in mine_eps}
    best = max(counts.values(), default=0)
    if best < 2:
        return None
    tied = [ep for ep, n in counts.items() if n == best]
    if len(tied) == 1:
        return tied[0]
    votes: Counter = Counter()
    for other in set().union(*(sharing[ep] for ep in tied)):
        theirs = [c for c in _outgoing(socks.get(other, [])) if c.remote in tied]
        if theirs:
            votes[min(theirs, key=lambda c: int(c.inode)).remote] += 1
    ranked = votes.most_common(2)
    if ranked and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):
        return ranked[0][0]
    return None


def _same_host(a: str, b: str) -> bool:
    return a == b or (_loopback(a) and _loopback(b))


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def shared_path(pid: int, path: str, proc: str = "/proc") -> bool:
    """``path`` lies on a filesystem several nodes can share (SHARED_FILESYSTEMS),
    as the process's mount namespace shows it."""
    best, fstype = "", ""
    try:
        with open(f"{proc}/{pid}/mountinfo") as f:
            for line in f:
                head, _, tail = line.partition(" - ")
                fields = head.split()
                if len(fields) < 5 or not tail:
                    continue
                mount = fields[4].replace("\\040", " ")
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) \
                        and len(mount) >= len(best):
                    best, fstype = mount, tail.split()[0]
    except OSError:
        return False
    return fstype in SHARED_FILESYSTEMS or fstype.split(".", 1)[0] in SHARED_FILESYSTEMS


def store_servers(pids: Iterable[int], proc: str = "/proc") -> dict[int, int]:
    """{pid: store port} for the processes among ``pids`` that serve a TCPStore
    the others use: a port the process listens on and is itself connected
    to, with at least one other of ``pids`` connected to it as well."""
    pids = list(pids)
    if len(pids) < 2:
        return {}
    socks = owned(pids, proc)
    out = {}
    for pid, mine in socks.items():
        listening = {c.local[1] for c in mine if c.state == _LISTEN}
        for port in listening:
            clients = {p for p, theirs in socks.items()
                       if any(c.state == _ESTABLISHED and c.remote[1] == port for c in theirs)}
            if pid in clients and clients - {pid}:
                out[pid] = port
    return out
